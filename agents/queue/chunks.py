"""Chunks and the prompts file's byte-offset index.

Generation 0's chunks follow from the pin alone: chunk c is the indices
`[c * chunk_size, min((c + 1) * chunk_size, lines))`. A retry generation's chunks are listed
in its record. The offset index (`RUN_DIR/queue/prompts.offsets`: one little-endian uint64
per line start, then the file's size) lets a node seek to a chunk instead of scanning the
file from the top, and tells a line's size before reading it."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agents.engine.prompts import BOM, TooLong
from agents.queue.ranges import Ranges, count, expand
from agents.rundir.atomic import atomic_write


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


class OffsetIndex:
    """Line start offsets of the prompts file, built once per run dir and checked against
    the file's size and line count at every load."""

    def __init__(self, offsets: array[int]) -> None:
        self.offsets = offsets

    @classmethod
    def build(cls, prompts: Path) -> OffsetIndex:
        offsets = array("Q")
        pos = 0
        tail = 0
        with open(prompts, "rb", buffering=0) as f:
            first = f.read(len(BOM))
            if first != BOM:
                f.seek(0)
            pos = f.tell()
            offsets.append(pos)
            while block := f.read(1 << 22):
                start = 0
                while (nl := block.find(b"\n", start)) >= 0:
                    offsets.append(pos + nl + 1)
                    start = nl + 1
                pos += len(block)
                tail = len(block) - start
        if tail == 0 and len(offsets) > 1:
            offsets.pop()  # the last newline ends the last line; no line starts after it
        elif tail == 0:
            offsets.pop()  # an empty file: no lines
        offsets.append(pos)  # the end
        return cls(offsets)

    @classmethod
    def load_or_build(cls, prompts: Path, path: Path, lines: int, size: int) -> OffsetIndex:
        try:
            raw = path.read_bytes()
            if len(raw) == 8 * (lines + 1):
                offsets = array("Q")
                offsets.frombytes(raw)
                if sys.byteorder != "little":
                    offsets.byteswap()
                if offsets[-1] == size:
                    return cls(offsets)
        except FileNotFoundError:
            pass
        index = cls.build(prompts)
        if index.lines != lines or index.offsets[-1] != size:
            raise ValueError(f"{prompts}: {index.lines} lines and {index.offsets[-1]} bytes now, "
                             f"pinned with {lines} lines and {size} bytes")
        out = array("Q", index.offsets)
        if sys.byteorder != "little":
            out.byteswap()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, out.tobytes())
        return index

    @property
    def lines(self) -> int:
        return len(self.offsets) - 1

    def read(self, prompts: Path, indices: Iterable[int], max_bytes: int
             ) -> Iterator[tuple[int, bytes | TooLong]]:
        """(index, line) for each index in order, seeking only where they jump; a line over
        `max_bytes` (newline not counted) is TooLong, never read."""
        offsets = self.offsets
        last = len(offsets) - 2
        with open(prompts, "rb", buffering=1 << 20) as f:
            ends_nl = True
            if last >= 0 and offsets[-1] > offsets[0]:
                f.seek(offsets[-1] - 1)
                ends_nl = f.read(1) == b"\n"
            at = -1
            for index in indices:
                start, end = offsets[index], offsets[index + 1]
                body = end - start - (1 if index < last or ends_nl else 0)
                if body > max_bytes:
                    yield index, TooLong(body, max_bytes)
                    at = -1
                    continue
                if at != start:
                    f.seek(start)
                yield index, f.read(end - start)
                at = end

    def chunk_lines(self, prompts: Path, chunk: Chunk, want: Callable[[int], bool],
                    max_bytes: int) -> Iterator[tuple[int, bytes | TooLong]]:
        """The lines of a chunk that `want(index)` accepts, in order."""
        return self.read(prompts, (i for i in expand(chunk.indices) if want(i)), max_bytes)
