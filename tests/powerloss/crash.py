"""Crash states from an operation log: record a run once, cut its power at many points.

The crash state at k is the disk as a power loss right after ops[0:k] leaves it (the durable
state after replaying them), written out as a plain folder on the real disk, on which a test
runs only recovery. It equals what a live power_loss() at that moment leaves
(test_crash_states.py shows it on random workloads).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.powerloss.oplog import Op
from tests.powerloss.volume import Volume


@dataclass(frozen=True)
class CrashState:
    k: int  # ops[0:k] had happened when the power went
    path: Path  # the disk a power loss then leaves, a plain folder


def crash_states(log: Sequence[Op], points: Iterable[int], into: Path,
                 keep: bool = False) -> Iterator[CrashState]:
    """The crash state at each of `points` (prefix lengths, 0..len(log)), in increasing order,
    each as a new folder under `into`. The log is replayed once, whatever the number of points.
    Each folder is removed when the next one is asked for (and at the end) unless keep=True."""
    ks = sorted(set(points))
    if ks and not 0 <= ks[0] <= ks[-1] <= len(log):
        raise ValueError(f"crash points must lie in 0..{len(log)}, got {ks[0]}..{ks[-1]}")
    vol = Volume()
    done = 0
    for k in ks:
        for op in log[done:k]:
            vol.apply(op)
        done = k
        folder = into / f"crash-{k:07d}"
        vol.materialize(folder, durable=True)
        try:
            yield CrashState(k, folder)
        finally:
            if not keep:
                shutil.rmtree(folder, ignore_errors=True)


def crash_state(log: Sequence[Op], k: int, into: Path) -> Path:
    """The crash state at k, kept at `into`/crash-k."""
    state = next(crash_states(log, [k], into, keep=True))
    return state.path


def replay(log: Sequence[Op]) -> Volume:
    """A Volume after all of `log`: what processes saw at its end (and its durable state)."""
    vol = Volume()
    for op in log:
        vol.apply(op)
    return vol
