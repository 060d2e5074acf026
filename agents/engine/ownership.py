"""ownership.jsonl: which indices a shard of a campaign gave away and took on.

A run owns its shard's indices (all of them when it has no shard), minus the ranges it
ceded, plus the ranges it adopted. Moving the tail from a slow node to an idle one is two
journaled steps: the slow node cedes (the record is fsynced before the answer, and a ceded
index is never sent again), then the idle node adopts (fsynced before its first request). A
crash between the two loses nothing: the cede stays, unadopted, until a `rebalance` adopts it
by its id; an id already journaled is answered with its record, so a retried step does
nothing twice. Ranges are `[start, stop, step]` (Python's range), compact for strided shards.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Container, Iterable, Iterator
from pathlib import Path
from typing import Literal

import msgspec

from agents.engine.durable import DurableAppend
from agents.rundir.atomic import cut_torn_tail
from agents.rundir.shard import Shard

FILE = "ownership.jsonl"
# One record may move at most this many indices (a 10M-prompt campaign's whole shard fits).
MAX_MOVE = 50_000_000
MAX_RANGES = 1_000_000

Range = tuple[int, int, int]


class OwnershipError(ValueError):
    pass


class OwnershipEvent(msgspec.Struct, omit_defaults=True):
    op: Literal["cede", "adopt"]
    id: str
    time: float
    ranges: list[Range]
    count: int
    node: str | None = None  # adopt: the node the indices came from
    shard: str | None = None  # adopt: the shard they came from ("3/8")


_decoder = msgspec.json.Decoder(OwnershipEvent)
_encoder = msgspec.json.Encoder()


class StrideRuns:
    """Increasing indices grouped, as they come, into `(start, stop, step)` runs of one step
    each (Python's range; a lone index has step 1); each closed run goes to `on_run`. The
    one grouping for a move's ranges and for the union's messages."""

    def __init__(self, on_run: Callable[[Range], None]) -> None:
        self.on_run = on_run
        self._cur: list[int] | None = None  # start, last, step (0: one index so far)

    def add(self, i: int) -> None:
        c = self._cur
        if c is None:
            self._cur = [i, i, 0]
        elif c[2] == 0:
            c[1], c[2] = i, i - c[0]
        elif i - c[1] == c[2]:
            c[1] = i
        else:
            self.close()
            self._cur = [i, i, 0]

    def close(self) -> None:
        if self._cur is not None:
            start, last, step = self._cur
            self._cur = None
            self.on_run((start, last + 1, step or 1))


def to_ranges(indices: Iterable[int]) -> list[Range]:
    """Sorted, distinct indices as `[start, stop, step]` runs of one step each."""
    out: list[Range] = []
    runs = StrideRuns(out.append)
    for i in sorted(set(indices)):
        runs.add(i)
    runs.close()
    return out


def check_ranges(ranges: object, where: str) -> list[Range]:
    """Ranges from outside (an RPC, a record in S3): refused with `where` unless each is three
    non-negative integers with start < stop and step >= 1, within MAX_MOVE indices in all."""
    if not isinstance(ranges, list) or len(ranges) > MAX_RANGES:
        raise OwnershipError(f"{where}: ranges must be a list of [start, stop, step] "
                             f"(at most {MAX_RANGES})")
    out: list[Range] = []
    total = 0
    for n, r in enumerate(ranges):
        if (not isinstance(r, list | tuple) or len(r) != 3
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)):
            raise OwnershipError(f"{where}: ranges[{n}] must be [start, stop, step], got {r!r}")
        start, stop, step = r
        if not (0 <= start < stop and step >= 1):
            raise OwnershipError(f"{where}: ranges[{n}] = {list(r)}: need 0 <= start < stop "
                                 "and step >= 1")
        total += len(range(start, stop, step))
        if total > MAX_MOVE:
            raise OwnershipError(f"{where}: more than {MAX_MOVE} indices in one move")
        out.append((start, stop, step))
    return out


def expand(ranges: Iterable[Range]) -> Iterator[int]:
    for start, stop, step in ranges:
        yield from range(start, stop, step)


class Ownership:
    """The owned set of one run, from its ownership.jsonl, and the journal's writer."""

    def __init__(self, shard: Shard | None, path: Path | None = None) -> None:
        self.shard = shard
        self.path = path
        self.ceded: set[int] = set()  # base indices given away
        self.adopted: set[int] = set()  # indices of other shards taken on
        self.cedes: dict[str, OwnershipEvent] = {}
        self.adopts: dict[str, OwnershipEvent] = {}
        self._file: DurableAppend | None = None
        self._writable = False  # load(write=True) until close(); the file opens at a first write

    @classmethod
    def load(cls, run_dir: Path, shard: Shard | None, write: bool = False) -> Ownership:
        """Read RUN_DIR/ownership.jsonl (a torn last line, from a crash mid-append, is cut when
        `write`); ValueError naming the file and line for a record that does not parse."""
        path = run_dir / FILE
        own = cls(shard, path)
        if write:
            cut_torn_tail(path)
        own.read_records(path)
        if write:
            # Opened at the first cede or adopt: a run that never moves an index (every run
            # outside a campaign) gets no ownership.jsonl.
            own._writable = True
        return own

    def read_records(self, path: Path) -> None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        self.apply_bytes(data, str(path))

    def apply_bytes(self, data: bytes, where: str) -> None:
        lines = data.split(b"\n")
        if data and not data.endswith(b"\n"):
            lines = lines[:-1]  # a torn last line: never fsynced, never answered
        for lineno, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                ev = _decoder.decode(raw)
                check_ranges([list(r) for r in ev.ranges], f"{where}:{lineno}")
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise OwnershipError(f"{where}:{lineno}: unreadable ownership record: "
                                     f"{exc}") from None
            self._apply(ev)

    def base(self, index: int) -> bool:
        return self.shard is None or self.shard.owns(index)

    def owns(self, index: int) -> bool:
        if index in self.adopted:
            return True
        return self.base(index) and index not in self.ceded

    def count(self, total: int) -> int:
        base = total if self.shard is None else self.shard.count(total)
        return base - len(self.ceded) + len(self.adopted)

    def owned_descending(self, total: int) -> Iterator[int]:
        """Owned indices below `total`, highest first (a cede takes from the end)."""
        if self.shard is None:
            base: Iterable[int] = range(total - 1, -1, -1)
        else:
            last = total - 1 - (total - 1 - self.shard.k) % self.shard.n
            base = range(last, -1, -self.shard.n) if total > self.shard.k else range(0)
        adopted = sorted((i for i in self.adopted if i < total), reverse=True)
        for i in heapq.merge(base, adopted, reverse=True):
            if self.owns(i):
                yield i

    def _apply(self, ev: OwnershipEvent) -> None:
        if ev.op == "cede":
            if ev.id in self.cedes:
                return
            self.cedes[ev.id] = ev
            for i in expand(ev.ranges):
                if i in self.adopted:
                    self.adopted.discard(i)
                else:
                    self.ceded.add(i)
        else:
            if ev.id in self.adopts:
                return
            self.adopts[ev.id] = ev
            for i in expand(ev.ranges):
                if i in self.ceded:
                    self.ceded.discard(i)
                elif not self.base(i):
                    self.adopted.add(i)

    @property
    def writable(self) -> bool:
        return self._writable

    def write(self, ev: OwnershipEvent) -> None:
        """Journal `ev`, fsynced (blocking: a worker thread may call it); the file is as it
        was when the write fails. `apply` it after, on the thread that reads the sets."""
        assert self._writable and self.path is not None, "load(write=True) first"
        if self._file is None:
            self._file = DurableAppend(self.path, "ownership")
        self._file.append(_encoder.encode(ev) + b"\n")

    def apply(self, ev: OwnershipEvent) -> None:
        self._apply(ev)

    def record(self, ev: OwnershipEvent) -> None:
        self.write(ev)
        self._apply(ev)

    def close(self) -> None:
        self._writable = False
        if self._file is not None:
            self._file.close()
            self._file = None

    def summary(self) -> dict[str, list[dict[str, object]]]:
        """For progress.json: each cede and adopt by id, with its count."""
        return {
            "cedes": [{"id": e.id, "count": e.count, "time": e.time}
                      for e in self.cedes.values()],
            "adopts": [{"id": e.id, "count": e.count, "node": e.node, "shard": e.shard,
                        "time": e.time} for e in self.adopts.values()],
        }


def pick_for_cede(owner: Ownership, total: int, count: int, done: Container[int],
                  busy: Container[int], failed: Container[int]) -> list[int]:
    """Up to `count` owned indices to give away, from the end of the to-do list: never one
    that is done, failed (it stays where its failure is journaled) or busy (in flight)."""
    picked: list[int] = []
    if count <= 0:
        return picked
    for i in owner.owned_descending(total):
        if i in done or i in busy or i in failed:
            continue
        picked.append(i)
        if len(picked) >= count:
            break
    return picked


def cede_event(id_: str, indices: list[int]) -> OwnershipEvent:
    return OwnershipEvent(op="cede", id=id_, time=time.time(), ranges=to_ranges(indices),
                          count=len(indices))


def adopt_event(id_: str, indices: list[int], node: str | None,
                shard: str | None) -> OwnershipEvent:
    return OwnershipEvent(op="adopt", id=id_, time=time.time(), ranges=to_ranges(indices),
                          count=len(indices), node=node, shard=shard)


def encode(ev: OwnershipEvent) -> bytes:
    return _encoder.encode(ev)


__all__ = ["FILE", "Ownership", "OwnershipError", "OwnershipEvent", "StrideRuns", "adopt_event",
           "cede_event", "check_ranges", "encode", "expand", "pick_for_cede", "to_ranges"]
