"""What each op of a recording touched (by path), where to cut, and the figures of a torture."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.powerloss.crash import crash_states
from tests.powerloss.oplog import Op
from tests.powerloss.volume import ROOT, Volume

SHM = Path("/dev/shm")  # crash states on tmpfs: recovery's fsyncs cost nothing there


class Violation(AssertionError):
    """A crash state after which recovery lost, doubled or miscounted something."""


@dataclass(frozen=True)
class Step:
    """One op of the log with the paths it touched (relative to the mount root)."""

    index: int  # the op is log[index]; cutting at index + 1 keeps it
    op: Op
    path: str
    new_path: str = ""  # a rename's target


def annotate(log: Sequence[Op]) -> list[Step]:
    """Every op with its path, by replaying the log (inode numbers -> names)."""
    vol = Volume()
    where: dict[int, tuple[int, str]] = {}

    def path(ino: int) -> str:
        parts = []
        while ino != ROOT and ino in where:
            parent, name = where[ino]
            parts.append(name)
            ino = parent
        return "/".join(reversed(parts))

    out = []
    for i, op in enumerate(log):
        a = op.args
        new = ""
        if op.kind in ("create", "mkdir"):
            ino = vol.next_ino
            vol.apply(op)
            where[ino] = (int(a[0]), str(a[1]))
            p = path(ino)
        elif op.kind == "rename":
            ino = vol.inodes[int(a[0])].entries[str(a[1])]
            p = path(ino)
            vol.apply(op)
            where[ino] = (int(a[2]), str(a[3]))
            new = path(ino)
        elif op.kind in ("unlink", "rmdir"):
            p = f"{path(int(a[0]))}/{a[1]}".lstrip("/")
            vol.apply(op)
        elif op.kind == "link":
            p = f"{path(int(a[1]))}/{a[2]}".lstrip("/")
            vol.apply(op)
        elif op.kind == "power_loss":
            vol.apply(op)
            where = {}
            for rel, node in vol.walk(durable=False):
                parent, _, name = rel.rpartition("/")
                where[node.ino] = (vol.resolve("/" + parent).ino if parent else ROOT, name)
            p = ""
        else:
            p = path(int(a[0]))
            vol.apply(op)
        out.append(Step(i, op, p, new))
    return out


def marks(steps: Sequence[Step], marks_file: str) -> dict[str, list[int]]:
    """Cuts right after each pass of each crash point (FLEETDECK_CRASH_MARKS=marks_file on the
    mount): name -> cut points."""
    out: dict[str, list[int]] = {}
    for s in steps:
        if s.op.kind == "write" and s.path == marks_file:
            data = s.op.args[2]
            assert isinstance(data, bytes)
            for name in data.decode().split():
                out.setdefault(name, []).append(s.index + 1)
    return out


def choose(n_ops: int, must: dict[str, list[int]], total: int, seed: int,
           per_kind: int | None = None) -> dict[int, str]:
    """Cut points: every point of `must` (each kind's, or `per_kind` of each spread over the
    recording when given), then random moments up to `total` in all. point -> why."""
    rng = random.Random(seed)
    cuts: dict[int, str] = {}
    for kind, points in sorted(must.items()):
        chosen = sorted(set(points))
        if per_kind is not None and len(chosen) > per_kind:
            step = len(chosen) / per_kind
            chosen = [chosen[int(i * step)] for i in range(per_kind)]
        for k in chosen:
            cuts.setdefault(k, kind)
    free = [k for k in range(n_ops + 1) if k not in cuts]
    for k in rng.sample(free, max(0, min(len(free), total - len(cuts)))):
        cuts[k] = "random"
    return cuts


@dataclass
class Figures:
    component: str
    ops: int = 0
    cuts: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)  # what recovery found, summed
    record_s: float = 0.0
    recover_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items()))
        kept = ", ".join(f"{k} {v:,}" for k, v in sorted(self.kept.items()))
        per = self.recover_s / self.cuts * 1000 if self.cuts else 0.0
        return (f"{self.component:10} {self.cuts:5,} cuts of {self.ops:,} ops ({kinds}); "
                f"kept: {kept}; recorded in {self.record_s:.1f} s, recovered in "
                f"{self.recover_s:.1f} s ({per:.0f} ms a cut)")


def cut_all(fig: Figures, log: Sequence[Op], cuts: dict[int, str], into: Path,
            recover: Callable[[int, Path], dict[str, Any]]) -> None:
    """Recovery on the crash state at each cut; `recover(k, folder)` raises Violation or
    returns figures (numbers are summed into fig.kept)."""
    t = time.monotonic()
    for state in _states(log, cuts, into):
        try:
            found = recover(state.k, state.path)
        except Violation as exc:
            raise Violation(f"{fig.component}: cut at op {state.k} of {len(log)} "
                            f"({cuts[state.k]}): {exc}") from None
        fig.cuts += 1
        fig.by_kind[cuts[state.k]] += 1
        for key, value in found.items():
            fig.kept[key] += value
    fig.recover_s += time.monotonic() - t


def _states(log: Sequence[Op], cuts: dict[int, str], into: Path) -> Iterator[Any]:
    into.mkdir(parents=True, exist_ok=True)
    yield from crash_states(log, cuts, into)
