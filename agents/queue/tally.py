"""The campaign's figures as its commits define them, kept on a node from the commit objects
it has read (each once: a commit never changes): each index counted once, from the commit of
its highest committing generation (a retry's outcome replaces the earlier one), done (cut at
max_tokens or not) or failed; and of those, the ones whose commit is this node's. Lines no
commit names (a backup that lost, a zombie, a chunk another node committed first) are in no
figure here. The same rule as `Union.final` (union.py), kept up commit by commit in two bytes
per index, so a snapshot a second reads counters, never the commits."""

from __future__ import annotations

import threading
from array import array
from dataclasses import dataclass

from agents.queue import records as rec
from agents.queue.ranges import expand

DONE, CUT, FAILED = 1, 2, 3  # an index's state; CUT is done, at max_tokens
MINE = 4
MAX_GENERATION = (1 << 13) - 2  # (generation + 1) << 3 fits a cell's 16 bits


@dataclass
class Figures:
    done: int = 0  # truncated ones included
    failed: int = 0
    truncated: int = 0


class Tally:
    def __init__(self, size: int, node: str) -> None:
        self.size = size
        self.node = node
        # Per index: (generation + 1) << 3 | MINE? | state; 0 while no commit read names it.
        self._cells = array("H", bytes(2 * size))
        self.seen: set[tuple[int, int]] = set()  # (generation, chunk) of each commit applied
        self.campaign = Figures()
        self.here = Figures()  # of the campaign's, those whose commit is this node's
        self._lock = threading.Lock()  # the finder's thread, the renewer's and the loop add

    def add(self, c: rec.Commit) -> bool:
        """One commit, checked already (union.commit_problem); False when it was in."""
        if not 0 <= c.generation <= MAX_GENERATION:
            raise ValueError(f"generation {c.generation}: more than {MAX_GENERATION}")
        base = (c.generation + 1) << 3 | (MINE if c.node == self.node else 0)
        cut = set(expand(c.truncated))
        with self._lock:
            key = (c.generation, c.chunk)
            if key in self.seen:
                return False
            self.seen.add(key)
            for i in expand(c.done):
                self._set(i, base | (CUT if i in cut else DONE))
            for i in expand(c.failed):
                self._set(i, base | FAILED)
        return True

    def has(self, generation: int, chunk: int) -> bool:
        return (generation, chunk) in self.seen

    def _set(self, i: int, cell: int) -> None:
        old = self._cells[i]
        if old >> 3 > cell >> 3:
            return  # a higher generation's commit, read first, holds the index
        if old:
            self._count(old, -1)
        self._cells[i] = cell
        self._count(cell, 1)

    def _count(self, cell: int, d: int) -> None:
        state = cell & 3
        for f in (self.campaign, self.here) if cell & MINE else (self.campaign,):
            if state == FAILED:
                f.failed += d
            else:
                f.done += d
                f.truncated += d * (state == CUT)

    @property
    def commits(self) -> int:
        return len(self.seen)
