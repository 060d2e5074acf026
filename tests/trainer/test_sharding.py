"""The drafter sharded with FSDP2: its gradients equal one process's on the same global
batch (2 processes, gloo, float32 compute: gloo on the CPU is tested without bf16), and
`[train] shard` decides as documented."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.trainer.conftest import REPO
from trainer import sharding
from trainer.data import DataError, accumulation
from trainer.distributed import Dist


def test_sharded_gradients_equal_one_process_on_the_same_global_batch() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tests.trainer.sharded_grads"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: 33 gradients, largest difference" in r.stdout


def test_shard_setting_decides() -> None:
    two = Dist(0, 2, 0, torch.device("cpu"))
    one = Dist(0, 1, 0, torch.device("cpu"))
    gib = 1 << 30
    # A Qwen3-8B drafter of 5 layers (~1.2e9 parameters) replicated: ~19 GB of state.
    assert sharding.replicated_bytes(1_200_000_000) == 19_200_000_000
    assert sharding.needs_sharding(1_200_000_000, 40 * gib)
    assert not sharding.needs_sharding(1_200_000_000, 80 * gib)
    assert not sharding.needs_sharding(10**12, None), "host memory: never short here"
    assert sharding.decide("always", 10, two) and not sharding.decide("never", 10**12, two)
    assert not sharding.decide("always", 10, one), "one process: nothing to shard"
    assert not sharding.decide("auto", 10**12, two), "on the CPU auto replicates"
    with pytest.raises(sharding.ShardError, match=r"\[train\] shard: 'half'"):
        sharding.decide("half", 10, two)


def test_accumulation_keeps_the_global_batch_or_says_why() -> None:
    assert [accumulation(6, 1, w) for w in (1, 2, 3, 6)] == [6, 3, 2, 1]
    assert accumulation(16, 2, 4) == 2
    with pytest.raises(DataError) as caught:
        accumulation(6, 1, 4)
    said = str(caught.value)
    assert "global batch is 6 samples a step" in said and "6 is not a multiple of 4" in said
    assert "resume on 1, 2, 3, 6 processes" in said
