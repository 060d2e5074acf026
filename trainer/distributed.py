"""The process group under torchrun: NCCL on GPUs, gloo on the CPU; a single process without.

Run several processes with `torchrun --standalone --nproc_per_node N -m trainer.cli train
RUN.toml` (or `fleetdeck-train train` with `[train] nproc`, which starts torchrun itself).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def init() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if world > 1:
            # Share the cores instead of each process taking them all.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local, device)


def all_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Sum a tensor over ranks (through the device the backend wants)."""
    if not d.enabled:
        return t
    moved = t.to(d.device)
    dist.all_reduce(moved, op=dist.ReduceOp.SUM)
    return moved.to(t.device)


def any_rank(flag: bool, d: Dist) -> bool:
    if not d.enabled:
        return flag
    return bool(all_sum(torch.tensor([1.0 if flag else 0.0]), d)[0] > 0)


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def close(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
