"""Does a fleetdeck drafter load under transformers 4.57 (z-lab's pin) through `auto_map`?

Outside the test suite (it builds a throwaway venv). With this repository's code and
transformers 5, the golden drafter (tests/fixtures/dflash) is written as a training
checkpoint (float32) and as a serving copy (bfloat16); then, in a venv holding only torch
2.13, transformers 4.57 and safetensors, each is loaded with
`AutoModel.from_pretrained(dir, trust_remote_code=True)` and run on the fixture's cases:
training (boolean mask), and two inference steps with transformers' own DynamicCache cropped
as z-lab's dflash_generate crops it. float32 must match the reference to 1e-5, bfloat16 to 2%
of the output scale. Prints one JSON line; exit 0 when everything matched.

    .venv/bin/python scripts/check_transformers457.py [--venv /tmp/tf457] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "dflash" / "golden.safetensors"


def build_venv(venv: Path) -> None:
    if (venv / "bin" / "python").exists():
        return
    subprocess.run(["python3", "-m", "venv", str(venv)],
                   check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0",
                    "transformers==4.57.*", "safetensors"], check=True)


def write(root: Path) -> None:
    """With this repository's code (transformers 5): the two checkpoints."""
    sys.path.insert(0, str(REPO))
    import torch

    from tests.trainer import golden
    from trainer.checkpoint import write_drafter

    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        (root / name).mkdir(parents=True)
        write_drafter(root / name, golden.model(), dtype)


def load(root: Path) -> dict[str, Any]:
    """Inside the 4.57 venv: only torch, transformers and safetensors."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModel, DynamicCache

    torch.set_num_threads(1)
    g = load_file(str(FIXTURE))

    def case(name: str) -> dict[str, torch.Tensor]:
        p = f"case.{name}."
        return {k[len(p):]: v for k, v in g.items() if k.startswith(p)}

    result: dict[str, Any] = {"transformers": transformers.__version__,
                              "torch": torch.__version__}
    ok = True
    for name, tolerance in (("float32", 1e-5), ("bfloat16", 0.02)):
        m = AutoModel.from_pretrained(str(root / name), trust_remote_code=True,
                                      torch_dtype="auto").eval()
        dt = next(m.parameters()).dtype
        t, one, two = case("train"), case("infer1"), case("infer2")
        with torch.no_grad():
            outs = {"train": m(position_ids=t["position_ids"], attention_mask=t["attention_mask"],
                               noise_embedding=t["noise_embedding"].to(dt),
                               target_hidden=t["target_hidden"].to(dt))}
            cache = DynamicCache()
            outs["infer1"] = m(position_ids=one["position_ids"],
                               noise_embedding=one["noise_embedding"].to(dt),
                               target_hidden=one["target_hidden"].to(dt),
                               past_key_values=cache, use_cache=True)
            cache.crop(7)  # 4.57 takes z-lab's positive length
            outs["infer2"] = m(position_ids=two["position_ids"],
                               noise_embedding=two["noise_embedding"].to(dt),
                               target_hidden=two["target_hidden"].to(dt),
                               past_key_values=cache, use_cache=True)
        diffs = {}
        for case_name, out in outs.items():
            ref = case(case_name)["output"]
            diff = float((out.float() - ref).abs().max())
            limit = tolerance if name == "float32" else tolerance * float(ref.abs().max())
            diffs[case_name] = diff
            ok = ok and diff <= limit
        rope = getattr(m.config, "rope_theta", None)
        ok = ok and rope == 1000000 and type(m).__module__.startswith("transformers_modules")
        result[name] = {"class": f"{type(m).__module__}.{type(m).__name__}", "dtype": str(dt),
                        "rope_theta_read": rope, "max_abs_diff": diffs}
    result["ok"] = ok
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", default="/tmp/tf457")
    ap.add_argument("--keep", help="write the checkpoints here instead of a temporary folder")
    ap.add_argument("--load", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load:
        result = load(Path(args.load))
        print(json.dumps(result))
        return 0 if result["ok"] else 1
    venv = Path(args.venv)
    build_venv(venv)
    with tempfile.TemporaryDirectory(prefix="fd-tf457-") as tmp:
        root = Path(args.keep or tmp)
        write(root / "ckpt")
        env = {**os.environ, "HF_MODULES_CACHE": str(root / "hf-modules")}
        proc = subprocess.run([str(venv / "bin" / "python"), __file__, "--load",
                               str(root / "ckpt")], env=env, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
