"""`fleetdeck-train` with one process slowed down, under torchrun:
`python -m tests.trainer.slow_rank STEPS SECONDS train RUN.toml`: in each step of STEPS
(comma-separated, counted from 1 in this invocation) the first process that does not lead
(rank 1 on one node; across nodes, node 1's) sleeps SECONDS before its first collective, as
a first compile or a recompile would hold it. Used by tests/trainer/test_startup_allowance.py."""

from __future__ import annotations

import sys
import time

from trainer import train
from trainer.cli import main
from trainer.objective import BlockStats


def slowed(steps: set[int], seconds: float) -> None:
    plain = train.Trainer.train_step
    taken = [0]

    def train_step(self: train.Trainer) -> BlockStats:
        taken[0] += 1
        held = self.d.rank == (1 if self.d.lead == 0 else 0)
        if held and taken[0] in steps:
            print(f"rank {self.d.rank} (node {self.d.node_rank}): step {taken[0]} held "
                  f"{seconds:g} s", file=sys.stderr, flush=True)
            time.sleep(seconds)
        return plain(self)

    train.Trainer.train_step = train_step  # type: ignore[method-assign]


if __name__ == "__main__":
    slowed({int(s) for s in sys.argv[1].split(",")}, float(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
