"""Which samples each rank trains on at each step, and their batches.

The order is a function of (seed, epoch) and the position a function of the step, so a
resumed run reads exactly the samples it would have read, with nothing to save but the step.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer.objective import Batch
from trainer.shards import Row, ShardSet


class DataError(ValueError):
    pass


class StepPlan:
    def __init__(self, n: int, world: int, rank: int, batch_size: int, grad_accum: int,
                 epochs: int, seed: int, max_steps: int | None = None) -> None:
        self.n, self.world, self.rank = n, world, rank
        self.batch_size, self.grad_accum, self.seed = batch_size, grad_accum, seed
        self.per_rank = n // world
        self.steps_per_epoch = self.per_rank // (batch_size * grad_accum)
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

    def rows(self, step: int, micro: int) -> list[int]:
        epoch = self.epoch_of(step)
        if epoch != self._epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._order = perm[self.rank: self.world * self.per_rank: self.world]
            self._epoch = epoch
        within = step % self.steps_per_epoch
        start = (within * self.grad_accum + micro) * self.batch_size
        return [int(i) for i in self._order[start: start + self.batch_size]]


def collate(rows: list[Row], pad_id: int = 0) -> Batch:
    """Right-padded: padding sits after every real token, so causal attention and the block
    mask (context before the anchor) never reach it."""
    s = max(len(r.input_ids) for r in rows)
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


def load_batch(shards: ShardSet, rows: list[int]) -> Batch:
    return collate([shards.row(i) for i in rows])
