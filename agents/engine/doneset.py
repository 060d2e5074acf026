"""The done-set: one bit per prompt index (1M indices = 125 KB), attempts only where > 1."""

from __future__ import annotations


class DoneSet:
    def __init__(self, size: int) -> None:
        self.size = size
        self._bits = bytearray((size + 7) // 8)
        self._count = 0
        # Indices generated more than once (retry truncated): index -> highest attempt.
        self._attempts: dict[int, int] = {}

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

    def __len__(self) -> int:
        return self._count

    def has(self, index: int, attempt: int) -> bool:
        return self.attempt(index) >= attempt
