"""Timeouts that fit compilation: a first step that holds one rank longer than
`node_timeout_s` (a first compile) passes under the start-up allowance; past
`startup_steps` the same hold stops the run within node_timeout_s, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.rundir.schema import train_progress_decoder
from tests.trainer.conftest import REPO, cli
from tests.trainer.tinyworld import World, word_lines, write_batches, write_spec

NODE_TIMEOUT_S = 4.0
HOLD_S = 3 * NODE_TIMEOUT_S


def test_a_slow_first_step_passes_and_a_slow_steady_step_stops_the_run(
        tmp_path: Path, random_world: World, capsys: pytest.CaptureFixture[str]) -> None:
    write_batches(tmp_path / "data", word_lines(60))
    spec = write_spec(tmp_path / "run.toml", str(tmp_path / "data"), random_world.target,
                      tmp_path / "run", batch_size=2, anchors=16, drafter_layers=1,
                      heldout_share=0.1, eval_samples=4, max_steps=8, save_every=100,
                      startup_steps=2, node_timeout_s=NODE_TIMEOUT_S, join_timeout_s=300.0,
                      shard="never")
    assert cli(capsys, "prepare", str(spec)).returncode == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # Rank 1 held in step 1 (start-up: waited for) and in step 4 (steady: not).
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tests.trainer.slow_rank", "1,4", str(HOLD_S), "train", str(spec)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert "rank 1: step 1 held" in r.stderr and "rank 1: step 4 held" in r.stderr, r.stderr
    assert r.returncode != 0, r.stderr[-3000:]
    assert "start-up over after 2 steps: collectives wait at most 4 s" in r.stderr
    p = train_progress_decoder.decode((tmp_path / "run" / "progress.json").read_bytes())
    # Steps 1-3 were taken (the first one's hold outlasted node_timeout_s threefold); step
    # 4's hold stopped the run with the collective's timeout.
    assert p.status == "failed" and p.step == 3, (p.status, p.step, p.message)
    assert p.message is not None and "timed out" in p.message.lower(), p.message
    assert "node_timeout_s = 4 s after the first 2 steps" in p.message, p.message
