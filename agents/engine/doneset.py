"""The done-set: one bit per prompt index (1M indices = 125 KB), attempts only where > 1."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

# A byte of the bits with an index not done in it.
_NOT_ALL_DONE = re.compile(rb"[^\xff]")


class DoneSet:
    def __init__(self, size: int) -> None:
        self.size = size
        self._bits = bytearray((size + 7) // 8)
        self._count = 0
        # Indices generated more than once (retry truncated): index -> highest attempt.
        self._attempts: dict[int, int] = {}
        # Told of each index newly done (the journal's count of failures not since done).
        self.on_new: Callable[[int], None] | None = None

    def add(self, index: int, attempt: int = 1) -> bool:
        """Mark index done at `attempt`; returns True when the index was not done before."""
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} outside 0..{self.size - 1}")
        byte, bit = divmod(index, 8)
        mask = 1 << bit
        new = not self._bits[byte] & mask
        if new:
            self._bits[byte] |= mask
            self._count += 1
            if self.on_new is not None:
                self.on_new(index)
        if attempt > 1 and attempt > self._attempts.get(index, 1):
            self._attempts[index] = attempt
        return new

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int) or not 0 <= index < self.size:
            return False
        byte, bit = divmod(index, 8)
        return bool(self._bits[byte] & (1 << bit))

    def attempt(self, index: int) -> int:
        """Highest attempt recorded for index; 0 when not done."""
        if index not in self:
            return 0
        return self._attempts.get(index, 1)

    def missing(self, start: int = 0) -> Iterator[int]:
        """The indices not done, from `start` on, in order, found lazily: a run of done ones
        is skipped at C speed (a regex over the bits), never index by index."""
        bits, size = self._bits, self.size
        pos = start // 8
        while (m := _NOT_ALL_DONE.search(bits, pos)) is not None:
            byte = m.start()
            for i in range(max(byte * 8, start), min(byte * 8 + 8, size)):
                if not bits[i >> 3] & (1 << (i & 7)):
                    yield i
            pos = byte + 1

    def __len__(self) -> int:
        return self._count

    def has(self, index: int, attempt: int) -> bool:
        return self.attempt(index) >= attempt
