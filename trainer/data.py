"""Which samples each rank trains on at each step, and their batches.

A step takes the next `global_batch` samples of the epoch's order (a function of seed and
epoch), split into micro-batches of `batch_size`: rank r's micro-batch m is slot
r * grad_accum + m. The global batch, not the rank, fixes what a step reads, so a run can go
on with another number of processes (grad_accum makes up the difference), and its position
is counted in samples consumed: step x global_batch.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer.objective import Batch
from trainer.shards import Row, ShardSet


class DataError(ValueError):
    pass


def accumulation(global_batch: int, batch_size: int, world: int) -> int:
    """The micro-batches per process that keep `global_batch` samples a step on `world`
    processes of `batch_size` each; DataError saying why when none does."""
    per_pass = batch_size * world
    if global_batch % per_pass:
        fits = [w for w in range(1, global_batch // batch_size + 1)
                if global_batch % (batch_size * w) == 0]
        raise DataError(
            f"the run's global batch is {global_batch} samples a step, which {world} "
            f"processes of batch_size {batch_size} cannot make ({global_batch} is not a "
            f"multiple of {per_pass}): it must stay the same for the run to mean the same; "
            f"resume on {', '.join(map(str, fits)) or 'no'} processes, or with a batch_size "
            f"that divides {global_batch} / {world}")
    return global_batch // per_pass


class StepPlan:
    def __init__(self, n: int, world: int, rank: int, batch_size: int, grad_accum: int,
                 epochs: int, seed: int, max_steps: int | None = None) -> None:
        self.n, self.world, self.rank = n, world, rank
        self.batch_size, self.grad_accum, self.seed = batch_size, grad_accum, seed
        self.global_batch = batch_size * grad_accum * world
        self.steps_per_epoch = n // self.global_batch
        if self.steps_per_epoch < 1:
            raise DataError(
                f"{n} training samples are too few for batch_size {batch_size} x grad_accum "
                f"{grad_accum} x {world} processes: lower them or prepare more data")
        self.total_steps = epochs * self.steps_per_epoch
        if max_steps is not None:
            self.total_steps = min(self.total_steps, max_steps)
        self._epoch = -1
        self._order = np.zeros(0, dtype=np.int64)

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def samples(self, step: int) -> int:
        """Samples consumed before `step` (the data position a checkpoint records)."""
        return step * self.global_batch

    def rows(self, step: int, micro: int) -> list[int]:
        epoch = self.epoch_of(step)
        if epoch != self._epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._epoch = epoch
        within = step % self.steps_per_epoch
        slot = self.rank * self.grad_accum + micro
        start = within * self.global_batch + slot * self.batch_size
        return [int(i) for i in self._order[start: start + self.batch_size]]


def collate(rows: list[Row], pad_id: int = 0, bucket: int = 1) -> Batch:
    """Right-padded (to a multiple of `bucket`): padding sits after every real token, so
    causal attention and the block mask (context before the anchor) never reach it."""
    s = -(-max(len(r.input_ids) for r in rows) // bucket) * bucket
    ids = torch.full((len(rows), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), s), dtype=torch.bool)
    attn = torch.zeros((len(rows), s), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.from_numpy(r.input_ids)
        mask[i, :n] = torch.from_numpy(r.loss_mask)
        attn[i, :n] = 1
    lengths = attn.sum(dim=1)
    return Batch(ids, mask, attn, lengths)


def load_batch(shards: ShardSet, rows: list[int], bucket: int = 1) -> Batch:
    return collate([shards.row(i) for i in rows], bucket=bucket)
