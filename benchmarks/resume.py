"""Resume cost at full size: a run directory with 1,000,000 done indices in 2,000 closed
batches. Time and peak memory until the engine is ready to dispatch, beside a naive recovery
that reads every batch file, measured in the same run. Targets: under 2 s and 200 MB.

    .venv/bin/python benchmarks/resume.py [--keep DIR] [--n 1000000]

--n sizes the run down (a multiple of 500; the tests run it small); the targets are for the
full size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

N = 1_000_000
BATCH = 500


def build(root: Path, n: int = N, total: int | None = None) -> Path:
    """The run directory: `total` prompts (n unless given), the first n of them done."""
    prompts = root / "prompts.jsonl"
    with open(prompts, "w") as f:
        for i in range(max(n, total or 0)):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
    spec = root / "run.toml"
    spec.write_text(textwrap.dedent(f"""\
        [run]
        name = "bench"
        dir = "{root / 'run'}"
        [servers]
        urls = ["http://127.0.0.1:9"]
        [generate]
        prompts = "{prompts}"
        batch_size = {BATCH}
        """))
    comp = root / "run" / "completions"
    comp.mkdir(parents=True)
    body = "x" * 300
    with open(comp / ".done_indices", "w") as done:
        for b in range(n // BATCH):
            lines = []
            for i in range(b * BATCH, (b + 1) * BATCH):
                lines.append(json.dumps({
                    "v": 1, "index": i, "messages": [{"role": "user", "content": f"q {i}"}],
                    "content": body, "finish_reason": "stop", "attempt": 1,
                    "usage": {"prompt_tokens": 9, "completion_tokens": 80,
                              "reasoning_tokens": 0}}))
                done.write(f"{i}\n")
            (comp / f"completions_{b:06d}.jsonl").write_text("\n".join(lines) + "\n")
    # A first prepare pins the prompts file (the sha256 scan happens once, at first launch).
    subprocess.run([sys.executable, "-c", ENGINE.format(spec=str(spec), n=n)], check=True,
                   capture_output=True, cwd=Path(__file__).resolve().parent.parent)
    return spec


ENGINE = """
import resource, time, sys
t = time.perf_counter()
from agents.rundir.spec import load_spec
from agents.engine.run import Engine
e = Engine(load_spec({spec!r}))
e.prepare()
assert len(e.store.done) == {n}, len(e.store.done)
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

NAIVE = """
import json, resource, time, glob
t = time.perf_counter()
done = set()
for path in sorted(glob.glob({folder!r} + "/completions_*.jsonl")):
    with open(path) as f:
        for line in f:
            done.add(json.loads(line)["index"])
assert len(done) == {n}
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def measure(code: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parent.parent)
    secs, mib = out.stdout.split()
    return float(secs), float(mib)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build the run directory here and keep it")
    ap.add_argument("--n", type=int, default=N, help=f"done indices (a multiple of {BATCH})")
    args = ap.parse_args()
    if args.n < BATCH or args.n % BATCH:
        ap.error(f"--n: a positive multiple of {BATCH}, not {args.n}")
    n = args.n
    root = args.keep or Path(tempfile.mkdtemp(prefix="fd-bench-resume-"))
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    spec = build(root, n)
    print(f"built {n:,} done indices in {n // BATCH:,} batches in "
          f"{time.perf_counter() - t:.1f} s at {root}")
    engine = min((measure(ENGINE.format(spec=str(spec), n=n)) for _ in range(3)),
                 key=lambda r: r[0])
    naive = min((measure(NAIVE.format(folder=str(root / "run" / "completions"), n=n))
                 for _ in range(3)), key=lambda r: r[0])
    print(f"engine ready to dispatch: {engine[0]:.2f} s, peak {engine[1]:.0f} MiB "
          "(targets: < 2 s, < 200 MB)")
    print(f"naive (read every batch):  {naive[0]:.2f} s, peak {naive[1]:.0f} MiB")
    print(f"ratio engine/naive: time {engine[0] / naive[0]:.3f}x, memory "
          f"{engine[1] / naive[1]:.3f}x")
    if not args.keep:
        import shutil

        shutil.rmtree(root)
    ok = engine[0] < 2.0 and engine[1] < 200
    print("targets met" if ok else "TARGETS MISSED")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
