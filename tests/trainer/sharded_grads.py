"""Run under torchrun (2 processes, gloo on the CPU): the sharded drafter's gradients on a
global batch of 4 micro-batches, 2 per process, against one process's on all 4 (exit 1 and
the largest difference when they differ). Used by tests/trainer/test_sharding.py."""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist

from tests.trainer.tinyworld import tiny_config
from trainer import sharding
from trainer.blocks import block_mask, position_ids
from trainer.contract import DFlashSettings, drafter_config
from trainer.distributed import init
from trainer.drafter import DFlashDraftModel

MICROS, BLOCK, CONTEXT = 4, 4, 24


def micro_loss(drafter: torch.nn.Module, j: int) -> torch.Tensor:
    """Micro-batch j: its inputs drawn from seed j, a loss of the drafter's output."""
    g = torch.Generator().manual_seed(j)
    h = drafter.config.hidden_size
    anchors = torch.tensor([[2, 9, 15]])
    noise = torch.randn(1, anchors.shape[1] * BLOCK, h, generator=g)
    feats = torch.randn(1, CONTEXT, 3 * h, generator=g)
    goal = torch.randn(1, anchors.shape[1] * BLOCK, h, generator=g)
    out = drafter(position_ids=position_ids(anchors, CONTEXT, BLOCK),
                  attention_mask=block_mask(anchors, None, CONTEXT, BLOCK),
                  noise_embedding=noise, target_hidden=feats)
    return ((out.float() - goal) ** 2).mean()


def main() -> int:
    d = init()
    torch.manual_seed(0)
    cfg = drafter_config(tiny_config(300, 8, 64), 2, DFlashSettings(BLOCK, 299, [1, 3, 5]))
    whole = DFlashDraftModel(cfg).float()
    sharded = copy.deepcopy(whole)
    sharding.shard(sharded, d, torch.float32)
    assert sharding.is_sharded(sharded), "fully_shard left the parameters whole"
    accum = MICROS // d.world
    for m in range(accum):  # this process's micro-batches of the global batch
        (micro_loss(sharded, d.rank * accum + m) / accum).backward()
    got = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}  # type: ignore
    for j in range(MICROS):
        (micro_loss(whole, j) / MICROS).backward()
    worst = max(float((got[n] - p.grad).abs().max()) for n, p in whole.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in whole.parameters())
    print(f"rank {d.rank}: {len(got)} gradients, largest difference {worst:.2e} "
          f"(largest gradient {scale:.2e})", flush=True)
    ok = worst <= 1e-5 * max(1.0, scale) and scale > 0
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
