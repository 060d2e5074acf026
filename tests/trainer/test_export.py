"""`fleetdeck-train export`: the serving folder, its README, pull, and refused inputs.

A two-step checkpoint of the tiny target is enough here (the e2e test exports a trained
drafter and decodes with the export). Bad checkpoints must stop `export` and `evaluate` with
exit 2 and a message naming the file and the problem, before any model loads.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import cli
from tests.trainer.test_train import SMALL
from tests.trainer.tinyworld import World, word_lines, write_batches, write_spec
from trainer import contract
from trainer.contract import TargetFacts


@pytest.fixture(scope="module", autouse=True)
def _hf_modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    import transformers.dynamic_module_utils as dmu

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf-modules")))
        yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, random_world: World) -> Path:
    """run.toml of a run with a checkpoint at step 2."""
    from trainer.cli import main

    tmp = tmp_path_factory.mktemp("export-run")
    write_batches(tmp / "data", word_lines(60))
    spec = write_spec(tmp / "run.toml", str(tmp / "data"), random_world.target, tmp / "run",
                      **{**SMALL, "max_steps": 2, "save_every": 2, "eval_prompts": 2,
                         "eval_max_new_tokens": 8})
    assert main(["prepare", str(spec)]) == 0
    assert main(["train", str(spec)]) == 0
    return spec


def _checkpoint(spec: Path) -> Path:
    (ckpt,) = (spec.parent / "run" / "checkpoints").glob("epoch_*_step_2")
    return ckpt


def test_export_writes_what_sglang_serves(trained: Path, random_world: World,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = trained.parent / "run"
    r = cli(capsys, "export", str(trained))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    out = run / "export"
    assert report["out"] == str(out) and report["checkpoint"] == str(_checkpoint(trained))
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "dflash.py", "README.md", "export.json",
            "tokenizer.json", "tokenizer_config.json"} <= names
    assert not list(run.glob(".tmp-*")), "nothing half-written is left"
    facts = TargetFacts.of(random_world.model.config)
    assert contract.problems(out, facts, full=True) == []
    c = json.loads((out / "config.json").read_text())
    assert c["dtype"] == c["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {
        torch.bfloat16}
    # The checkpoint's float32 weights, rounded once.
    source = load_file(str(_checkpoint(trained) / "model.safetensors"))
    served = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(served[k], v.to(torch.bfloat16)) for k, v in source.items())

    # The mask token is the first row past the tokenizer: the exported tokenizer maps
    # <|MASK|> there, as SGLang would when it adds the token itself.
    from transformers import AutoTokenizer

    mask_id = len(random_world.tokenizer)
    assert c["dflash_config"]["mask_token_id"] == mask_id == report["mask_token_id"]
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.convert_tokens_to_ids("<|MASK|>") == mask_id and tok.mask_token == "<|MASK|>"
    assert report["mask_token_added"] is True

    readme = (out / "README.md").read_text()
    flags = ("--model-path " + str(random_world.target),
             "--speculative-algorithm DFLASH", f"--speculative-draft-model-path {out}",
             "--speculative-num-draft-tokens 16")
    assert all(f in readme for f in flags), readme
    assert report["sglang_args"] == [
        "python", "-m", "sglang.launch_server", "--model-path", str(random_world.target),
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(out),
        "--speculative-num-draft-tokens", "16"]
    assert "tau | not measured: run `fleetdeck-train evaluate" in readme
    assert report["tau"] is None

    # evaluate keeps its tau with the checkpoint; the next export quotes it.
    r = cli(capsys, "evaluate", str(trained), "--checkpoint", "latest")
    assert r.returncode == 0, r.stderr
    tau = json.loads(r.stdout)["tau"]
    assert (_checkpoint(trained) / "evaluation.json").exists()
    r = cli(capsys, "export", str(trained), "--checkpoint", "latest")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tau"] == pytest.approx(tau)
    assert f"tau | {tau:.2f} tokens per target forward over 2 held-out prompts" in (
        out / "README.md").read_text()
    assert json.loads((out / "export.json").read_text())["tau"] == pytest.approx(tau)


def test_the_export_loads_through_auto_model(trained: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModel

    out = trained.parent / "somewhere" / "served"
    r = cli(capsys, "export", str(trained), "--to", str(out))
    assert r.returncode == 0, r.stderr
    m = AutoModel.from_pretrained(str(out), trust_remote_code=True)
    assert type(m).__module__.startswith("transformers_modules")
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    h = m.config.hidden_size
    with torch.no_grad():
        noise = torch.randn(1, 4, h, dtype=torch.bfloat16)
        feats = torch.randn(1, 6, 5 * h, dtype=torch.bfloat16)
        hidden = m(position_ids=torch.arange(10)[None], noise_embedding=noise,
                   target_hidden=feats)
    assert hidden.shape == (1, 4, h) and torch.isfinite(hidden).all()


def test_pull_takes_the_export(trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agents.artifacts.manifest import Manifest
    from console.artifacts.pullset import pull_set

    run = trained.parent / "run"
    assert cli(capsys, "export", str(trained)).returncode == 0
    entries = Manifest(run).entries()
    progress = json.loads((run / "progress.json").read_text())
    chosen = {e.path for e in pull_set(entries, "train", False, progress)}
    exported = {f"export/{p.name}" for p in (run / "export").iterdir()}
    assert exported and exported <= chosen


Breakage = Callable[[Path], None]


def _config_edit(**changes: Any) -> Breakage:
    def apply(folder: Path) -> None:
        c = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            if "." in key:
                outer, inner = key.split(".")
                c[outer][inner] = value
            else:
                c[key] = value
        (folder / "config.json").write_text(json.dumps(c))
    return apply


def _vocab_edit(folder: Path) -> None:
    c = json.loads((folder / "config.json").read_text())
    _config_edit(**{"dflash_config.mask_token_id": c["vocab_size"]})(folder)


@pytest.mark.parametrize(("breakage", "message"), [
    (lambda f: (f / "model.safetensors").unlink(), "model.safetensors: missing"),
    (lambda f: (f / "config.json").unlink(), "config.json: missing"),
    (_config_edit(num_hidden_layers=2), "tensors the config needs, e.g. ['layers.1."),
    (_config_edit(intermediate_size=64), "layers.0.mlp.gate_proj.weight is [128, 64], the "
                                         "config says [64, 64]"),
    (_vocab_edit, "is outside the vocab of"),
])
@pytest.mark.parametrize("verb", ["export", "evaluate"])
def test_a_broken_checkpoint_exits_2_naming_the_problem(
        trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str,
        breakage: Breakage, message: str) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(_checkpoint(trained), broken)
    breakage(broken)
    r = cli(capsys, verb, str(trained), "--checkpoint", str(broken))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and str(broken) in r.stderr, r.stderr


def test_export_refuses_a_tokenizer_that_puts_mask_elsewhere_and_a_foreign_folder(
        trained: Path, random_world: World, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    tok = random_world.tokenizer.__class__.from_pretrained(str(random_world.target))
    tok.add_special_tokens({"additional_special_tokens": ["<|other|>", "<|MASK|>"]})
    tok.save_pretrained(str(tmp_path / "tok"))
    spec = write_spec(tmp_path / "tok.toml", "unused", random_world.target,
                      trained.parent / "run", tokenizer=str(tmp_path / "tok"))
    r = cli(capsys, "export", str(spec))
    assert r.returncode == 2
    assert f"maps <|MASK|> to {len(random_world.tokenizer) + 1}; SGLang refuses" in r.stderr
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("keep me")
    r = cli(capsys, "export", str(trained), "--to", str(foreign))
    assert r.returncode == 2 and "is not an export" in r.stderr
    assert (foreign / "todo.txt").read_text() == "keep me"
