"""Run under torchrun (2 processes, gloo on the CPU): the collectives' timeout of
trainer/distributed.py's Allowance, with rank 1 held HOLD_S (a compile) before a collective
and STEADY_S as node_timeout_s. One node: always waited for. Across nodes: waited for in a
step where rank 1 has a shape new to it, not in a step of shapes both have seen (rank 0's
collective times out). Each finding is a line on stdout; exit 1 if one is wrong. Used by
tests/trainer/test_startup_allowance.py."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Hashable

import torch

from trainer.distributed import Allowance, Dist, all_sum, init

STEADY_S, HOLD_S = 4.0, 12.0


def collective(d: Dist, hold: bool) -> float:
    """An all-reduce that rank 1 reaches HOLD_S late (with `hold`); its seconds here."""
    if hold and d.rank == 1:
        time.sleep(HOLD_S)
    began = time.monotonic()
    total = all_sum(torch.ones(1), d)
    assert float(total[0]) == d.world, total
    return time.monotonic() - began


def main() -> int:
    d = init(startup_timeout_s=300.0)
    ok = True
    one = Allowance(dataclasses.replace(d, nodes=1), 300.0, STEADY_S, 1, recompiles=True)
    with one.step([("a",)]):
        collective(d, hold=False)
    one.after_step(1)
    with one.step([("a",)]) as generous:
        waited = collective(d, hold=True)
    print(f"rank {d.rank}: one node, steady {one.steady}, generous {generous}: waited "
          f"{waited:.1f} s", flush=True)
    ok &= not one.steady

    many = Allowance(dataclasses.replace(d, nodes=2), 300.0, STEADY_S, 1, recompiles=True)
    with many.step([("a",)]):
        collective(d, hold=False)
    many.after_step(1)
    ok &= many.steady
    mine: list[Hashable] = [("a",)] if d.rank == 0 else [("a",), ("b",)]
    with many.step(mine) as generous:
        waited = collective(d, hold=True)
    print(f"rank {d.rank}: nodes, a new shape on rank 1: generous {generous}, waited "
          f"{waited:.1f} s", flush=True)
    ok &= generous
    with many.step(mine) as generous:
        if d.rank == 1:
            time.sleep(HOLD_S)  # held, then gone: rank 0 must not wait for it
        else:
            began = time.monotonic()
            try:
                waited = collective(d, hold=False)
                print(f"rank 0: nodes, seen shapes: generous {generous}, waited {waited:.1f} s",
                      flush=True)
                ok = False
            except RuntimeError as exc:
                gave_up = time.monotonic() - began
                print(f"rank 0: nodes, seen shapes: generous {generous}, gave up after "
                      f"{gave_up:.1f} s: {str(exc).splitlines()[0][:120]}", flush=True)
                ok &= gave_up < HOLD_S
    ok &= not generous
    # No barrier or destroy: rank 0's group is broken by its timeout; the exit lets it go.
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    code = main()
    sys.stdout.flush()
    # Straight out: rank 0's gloo group is broken by its timeout, and tearing it down at the
    # interpreter's exit can abort the process ("terminate called without an active
    # exception", exit -6: ci11) after every finding was already right.
    os._exit(code)
