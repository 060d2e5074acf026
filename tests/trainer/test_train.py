"""`fleetdeck-train train`: checkpoints, progress.json, exact resume, DDP under torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from agents.rundir.schema import train_progress_decoder
from tests.trainer.conftest import BIN, REPO, cli
from tests.trainer.tinyworld import World, word_lines, write_batches, write_spec

SMALL = {"batch_size": 4, "anchors": 16, "drafter_layers": 1, "heldout_share": 0.1,
         "eval_samples": 4}


def prepared_run(tmp_path: Path, world: World, name: str, capsys: Any, **train: Any) -> Path:
    data = tmp_path / "data"
    if not data.exists():
        write_batches(data, word_lines(60))
    spec = write_spec(tmp_path / f"{name}.toml", str(data), world.target, tmp_path / name,
                      **{**SMALL, **train})
    r = cli(capsys, "prepare", str(spec))
    assert r.returncode == 0, r.stderr
    return spec


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    (ckpt,) = (run / "checkpoints").glob(f"epoch_*_step_{step}")
    return load_file(str(ckpt / "model.safetensors"))


def test_resume_continues_exactly(tmp_path: Path, random_world: World,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    straight = prepared_run(tmp_path, random_world, "straight", capsys, max_steps=8,
                            save_every=4)
    r = cli(capsys, "train", str(straight))
    assert r.returncode == 0, r.stderr
    halves = prepared_run(tmp_path, random_world, "halves", capsys, max_steps=8, save_every=4)
    r = cli(capsys, "train", str(halves), "--steps", "4")
    assert r.returncode == 0, r.stderr
    progress = train_progress_decoder.decode((tmp_path / "halves/progress.json").read_bytes())
    assert progress.status == "stopped" and progress.step == 4
    # Starting again without --resume would mix two runs' checkpoints: refused.
    r = cli(capsys, "train", str(halves))
    assert r.returncode == 2 and "pass --resume" in r.stderr
    r = cli(capsys, "train", str(halves), "--resume")
    assert r.returncode == 0, r.stderr

    a, b = weights(tmp_path / "straight", 8), weights(tmp_path / "halves", 8)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    # And the run did train: the weights moved from the first checkpoint.
    assert not torch.equal(weights(tmp_path / "straight", 4)["fc.weight"], a["fc.weight"])

    progress = train_progress_decoder.decode((tmp_path / "halves/progress.json").read_bytes())
    assert progress.kind == "train" and progress.status == "done"
    assert progress.step == progress.total_steps == 8
    assert len(progress.accuracy) == 15 and progress.loss is not None
    assert progress.accept_length is not None and progress.accept_length >= 1.0
    assert progress.last_checkpoint and progress.last_checkpoint.endswith("_step_8")
    assert progress.best_checkpoint is not None and progress.tokens_per_s > 0
    assert progress.lr >= 0 and progress.eta_hours == 0.0


def test_checkpoint_layout(tmp_path: Path, random_world: World,
                           capsys: pytest.CaptureFixture[str]) -> None:
    spec = prepared_run(tmp_path, random_world, "run", capsys, max_steps=3, save_every=1,
                        keep_last=2)
    assert cli(capsys, "train", str(spec)).returncode == 0
    out = tmp_path / "run" / "checkpoints"
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("epoch_"))
    best = json.loads((out / "best.json").read_text())
    assert set(names) == {"epoch_0_step_2", "epoch_0_step_3", best["checkpoint"]}
    ckpt = out / "epoch_0_step_3"
    assert {p.name for p in ckpt.iterdir()} == {"model.safetensors", "config.json", "dflash.py",
                                               "training_state.pt", "metrics.json",
                                               "manifest.sha256.json", "distcp"}
    # The resume's copy (torch.distributed.checkpoint), sealed with the rest.
    manifest = json.loads((ckpt / "manifest.sha256.json").read_text())
    assert {f["path"] for f in manifest["files"]} >= {"distcp/.metadata", "model.safetensors"}
    keys = load_file(str(ckpt / "model.safetensors")).keys()
    assert not any("embed" in k or "lm_head" in k for k in keys), "the target's own, frozen"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["dflash_config"] == {"block_size": 16,
                                       "mask_token_id": len(random_world.tokenizer),
                                       "target_layer_ids": [1, 2, 3, 4, 5]}
    # float32 for an exact resume, and the config says so (the export makes bfloat16).
    assert config["dtype"] == config["torch_dtype"] == "float32"
    assert {t.dtype for t in load_file(str(ckpt / "model.safetensors")).values()} == {
        torch.float32}
    assert config["num_target_layers"] == random_world.model.config.num_hidden_layers
    assert config["num_hidden_layers"] == 1
    assert config["hidden_size"] == random_world.model.config.hidden_size
    state = torch.load(ckpt / "training_state.pt", weights_only=True)
    assert state["step"] == 3 and state["global_batch"] == 4 and state["samples"] == 12
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(ckpt / "distcp", tmp_path / "flat.pt")
    flat = torch.load(tmp_path / "flat.pt", weights_only=True)
    # AdamW's moments by parameter name, three steps taken.
    assert float(flat["optim"]["state"]["fc.weight"]["step"]) == 3.0
    assert flat["optim"]["state"]["fc.weight"]["exp_avg"].shape == flat["model"]["fc.weight"].shape


def test_ddp_two_processes_on_the_cpu(tmp_path: Path, random_world: World,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = prepared_run(tmp_path, random_world, "ddp", capsys, max_steps=4, save_every=2,
                        batch_size=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # Two ranks on a loaded 2-core box take minutes (seen: over 240 s beside another suite).
    # Its own session: past the bound the ranks go too, not only torchrun (once, in CI, they
    # hung after the step-2 checkpoint; the failure then says where, from their log's end).
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "trainer.cli", "train", str(spec)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
        start_new_session=True)
    try:
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"two ranks past 600 s; their log's end:\n{err[-6000:]}") from None
    assert proc.returncode == 0, err[-3000:]
    progress = train_progress_decoder.decode((tmp_path / "ddp/progress.json").read_bytes())
    assert progress.world_size == 2 and progress.status == "done" and progress.step == 4
    out = tmp_path / "ddp" / "checkpoints"
    assert (out / "epoch_0_step_4" / "model.safetensors").exists()
    state = torch.load(out / "epoch_0_step_4" / "training_state.pt", weights_only=True)
    assert state["world_size"] == 2


def test_sigterm_stops_with_a_checkpoint_and_resume_goes_on(
        tmp_path: Path, random_world: World, capsys: pytest.CaptureFixture[str]) -> None:
    spec = prepared_run(tmp_path, random_world, "run", capsys, max_steps=5000,
                        save_every=5000)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([str(BIN / "fleetdeck-train"), "train", str(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    progress_path = tmp_path / "run" / "progress.json"
    try:
        deadline = time.monotonic() + 300
        while True:  # until the run has taken a few steps
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no progress within 300 s"
            if progress_path.exists():
                p = train_progress_decoder.decode(progress_path.read_bytes())
                if p.status == "running" and p.step >= 2:
                    break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=600)  # a drain on a loaded box
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    p = train_progress_decoder.decode(progress_path.read_bytes())
    assert p.status == "stopped" and 2 <= p.step < 5000
    assert p.last_checkpoint and p.last_checkpoint.endswith(f"_step_{p.step}")
    assert Path(p.last_checkpoint, "model.safetensors").exists()
    r = cli(capsys, "train", str(spec), "--resume", "--steps", "2")
    assert r.returncode == 0, r.stderr
    again = train_progress_decoder.decode(progress_path.read_bytes())
    assert again.step == p.step + 2 and again.status == "stopped"


def test_step_plan_ranks_accumulation_and_epochs() -> None:
    from trainer.data import DataError, StepPlan

    plans = [StepPlan(50, 2, r, batch_size=3, grad_accum=2, epochs=3, seed=7) for r in (0, 1)]
    p0 = plans[0]
    assert p0.steps_per_epoch == 4 and p0.total_steps == 12  # 25 per rank // (3 x 2)
    for step in range(4):
        rows = [set(p.rows(step, m)) for p in plans for m in range(2)]
        assert all(len(r) == 3 for r in rows)
        assert len(set().union(*rows)) == 12, "micro-batches and ranks never overlap"
    epoch0 = [i for s in range(4) for m in range(2) for i in p0.rows(s, m)]
    epoch1 = [i for s in range(4, 8) for m in range(2) for i in p0.rows(s, m)]
    assert epoch0 != epoch1, "a new order each epoch"
    again = StepPlan(50, 2, 0, batch_size=3, grad_accum=2, epochs=3, seed=7)
    assert [again.rows(9, 1), again.rows(2, 0)] == [p0.rows(9, 1), p0.rows(2, 0)]
    assert StepPlan(50, 1, 0, 3, 2, 3, 7, max_steps=5).total_steps == 5
    with pytest.raises(DataError, match="too few for batch_size 8 x grad_accum 4 x 2"):
        StepPlan(50, 2, 0, 8, 4, 1, 0)
