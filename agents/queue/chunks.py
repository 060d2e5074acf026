"""Chunks. Generation 0's chunks follow from the pin alone: chunk c is the indices
`[c * chunk_size, min((c + 1) * chunk_size, lines))`. A retry generation's chunks are listed
in its record. A node reads a chunk's lines through the prompts file's byte-offset index
(agents/engine/offsets.py)."""

from __future__ import annotations

from dataclasses import dataclass

from agents.queue.ranges import Ranges, count


@dataclass(frozen=True)
class Chunk:
    generation: int
    number: int
    indices: Ranges

    @property
    def name(self) -> str:
        return str(self.number) if self.generation == 0 else \
            f"{self.number} of gen {self.generation}"

    @property
    def size(self) -> int:
        return count(self.indices)

    @property
    def attempt(self) -> int:
        """The `attempt` of this generation's lines: a retry's line outranks the first."""
        return self.generation + 1


def first_generation(lines: int, chunk_size: int) -> list[Chunk]:
    return [Chunk(0, c, [(c * chunk_size, min((c + 1) * chunk_size, lines))])
            for c in range(-(-lines // chunk_size))]


def cut(indices: Ranges, chunk_size: int) -> list[Ranges]:
    """Ranges cut into pieces of `chunk_size` indices each (the last may be smaller)."""
    out: list[Ranges] = []
    cur: Ranges = []
    room = chunk_size
    for start, stop in indices:
        while start < stop:
            take = min(room, stop - start)
            cur.append((start, start + take))
            start += take
            room -= take
            if room == 0:
                out.append(cur)
                cur, room = [], chunk_size
    if cur:
        out.append(cur)
    return out
