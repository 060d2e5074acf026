"""One run, several numbers of processes: a run trained on 2 ranks with its drafter sharded
(FSDP2, gloo on the CPU) resumes on 1 and on 3 (replicated) at the same step, with the same
global batch, data position and optimizer state, and goes on as the 2-rank run went on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.conftest import REPO, cli, run_cli
from tests.trainer.tinyworld import World, word_lines, write_batches, write_spec

# A global batch of 6 (batch_size 1 x grad_accum 3 x 2 ranks): 1 and 3 ranks keep it, 4 not.
RUN: dict[str, Any] = {"batch_size": 1, "grad_accum": 3, "anchors": 16, "drafter_layers": 1,
                       "heldout_share": 0.1, "eval_samples": 4, "max_steps": 4,
                       "save_every": 2, "keep_last": 5}


def torchrun(spec: Path, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # Three ranks on a loaded 2-core box take minutes.
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(nproc), "-m", "trainer.cli", "train", str(spec), *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900)


def flat(ckpt: Path, tmp: Path) -> dict[str, Any]:
    """A checkpoint's distcp/ as one dict (weights and optimizer state by name)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{ckpt.parent.parent.name}-{ckpt.name}.pt"
    dcp_to_torch_save(ckpt / "distcp", out)
    state: dict[str, Any] = torch.load(out, weights_only=True)
    return state


def test_a_sharded_run_resumes_on_one_and_on_three_processes(
        tmp_path: Path, random_world: World, capsys: pytest.CaptureFixture[str]) -> None:
    write_batches(tmp_path / "data", word_lines(60))
    prepared = tmp_path / "prepared"

    def spec(name: str, **keys: Any) -> Path:
        return write_spec(tmp_path / f"{name}.toml", str(tmp_path / "data"),
                          random_world.target, tmp_path / name, prepared=str(prepared),
                          **{**RUN, **keys})

    two = spec("two", shard="always")
    assert cli(capsys, "prepare", str(two)).returncode == 0
    r = torchrun(two, 2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "drafter sharded over 2 processes" in r.stderr
    out2 = tmp_path / "two" / "checkpoints"
    state2 = torch.load(out2 / "epoch_0_step_2" / "training_state.pt", weights_only=True)
    assert (state2["global_batch"], state2["samples"], state2["sharded"]) == (6, 12, True)
    reference = flat(out2 / "epoch_0_step_4", tmp_path)
    # The loaders' copy is the whole drafter, gathered from the shards.
    whole = load_file(str(out2 / "epoch_0_step_4" / "model.safetensors"))
    for k, v in reference["model"].items():
        assert torch.equal(whole[k], v), k

    def from_step_2(name: str) -> Path:
        out = tmp_path / name / "checkpoints"
        out.mkdir(parents=True)
        shutil.copytree(out2 / "epoch_0_step_2", out / "epoch_0_step_2")
        return out

    # A world size that cannot keep the global batch is refused, saying why (here: one
    # process of batch_size 4 cannot make 6 samples).
    out1 = from_step_2("one")
    r1 = cli(capsys, "train", str(spec("one", batch_size=4)), "--resume")
    assert r1.returncode == 2
    assert "global batch is 6 samples a step" in r1.stderr and "not a multiple of 4" in r1.stderr

    resumed = {1: run_cli("train", str(spec("one")), "--resume")}
    assert resumed[1].returncode == 0, resumed[1].stderr[-3000:]
    out3 = from_step_2("three")
    resumed[3] = torchrun(spec("three", shard="never"), 3, "--resume")
    assert resumed[3].returncode == 0, resumed[3].stderr[-3000:]
    for (n, r), out in zip(resumed.items(), (out1, out3), strict=True):
        assert (f"at step 2 (12 samples consumed, global batch 6 = batch_size 1 x grad_accum "
                f"{6 // n} x {n} processes)") in r.stderr
        again = flat(out / "epoch_0_step_4", tmp_path)
        state = torch.load(out / "epoch_0_step_4" / "training_state.pt", weights_only=True)
        assert (state["step"], state["samples"], state["world_size"]) == (4, 24, n)
        # Steps 3 and 4 read the same samples with the same anchors: the same weights and
        # AdamW moments as the 2-rank run's, to the order of float additions.
        for k, v in reference["model"].items():
            torch.testing.assert_close(again["model"][k], v, rtol=1e-4, atol=2e-5, msg=k)
        for k, moments in reference["optim"]["state"].items():
            assert float(again["optim"]["state"][k]["step"]) == float(moments["step"]) == 4
            for m in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(again["optim"]["state"][k][m], moments[m],
                                           rtol=1e-3, atol=1e-7, msg=f"{k} {m}")
        assert not torch.equal(again["model"]["fc.weight"],
                               flat(out2 / "epoch_0_step_2", tmp_path)["model"]["fc.weight"])
