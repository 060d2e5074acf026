"""The prompts file's byte-offset index: `RUN_DIR/prompts.offsets`, one little-endian uint64
per line start, then the file's size. The engine reads the lines it still has to send by
seeking through it (a resume over a million done lines reads none of them) and a campaign node
reads a chunk's lines the same way.

Lines are what `agents.engine.prompts.stream` yields: a BOM before the first line is not part
of it, every line keeps its newline, the last may have none, and a line over `max_bytes`
(newline not counted) is TooLong, never read.

The file is checked against the prompts file's size and line count when it is loaded, and,
since nothing in a run directory is trusted, every line read through it is checked too: it
starts after a newline (or at the first line's start) and holds exactly one newline, at its
end. An index that does not match the file raises StaleOffsets; the engine builds it again."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

from agents.engine.prompts import BOM, TooLong
from agents.rundir.atomic import atomic_write

FILE = "prompts.offsets"


class StaleOffsets(ValueError):
    """The offset index does not describe the prompts file (edited, or written by someone
    else): build it again."""


class OffsetIndex:
    """Line start offsets of the prompts file."""

    def __init__(self, offsets: array[int], path: Path | None = None) -> None:
        self.offsets = offsets
        self.path = path

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
    def load_or_build(cls, prompts: Path, path: Path, lines: int, size: int,
                      rebuild: bool = False) -> OffsetIndex:
        """The index at `path` when it fits `lines` and `size`, else built from the file and
        saved there; `rebuild` builds it whatever is there (after StaleOffsets)."""
        try:
            raw = b"" if rebuild else path.read_bytes()
            if len(raw) == 8 * (lines + 1):
                offsets = array("Q")
                offsets.frombytes(raw)
                if sys.byteorder != "little":
                    offsets.byteswap()
                if offsets[-1] == size:
                    return cls(offsets, path)
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
        index.path = path
        return index

    @property
    def lines(self) -> int:
        return len(self.offsets) - 1

    def _stale(self, prompts: Path, index: int, why: str) -> StaleOffsets:
        where = self.path if self.path is not None else "the offset index"
        return StaleOffsets(f"{where} does not match {prompts} at line {index + 1}: {why}")

    def read(self, prompts: Path, indices: Iterable[int], max_bytes: int
             ) -> Iterator[tuple[int, bytes | TooLong]]:
        """(index, line) for each index in order, seeking only where they jump; a line over
        `max_bytes` (newline not counted) is TooLong, never read (its ends are checked)."""
        offsets = self.offsets
        first_start = offsets[0] if len(offsets) > 1 else 0
        last = len(offsets) - 2
        with open(prompts, "rb", buffering=1 << 20) as f:
            ends_nl = True
            if last >= 0 and offsets[-1] > offsets[0]:
                f.seek(offsets[-1] - 1)
                ends_nl = f.read(1) == b"\n"
            at = -1
            for index in indices:
                start, end = offsets[index], offsets[index + 1]
                has_nl = index < last or ends_nl
                if end <= start:
                    raise self._stale(prompts, index, "a line of no bytes")
                body = end - start - (1 if has_nl else 0)
                if at != start and start != first_start:
                    f.seek(start - 1)
                    if f.read(1) != b"\n":
                        raise self._stale(prompts, index, "it does not start after a newline")
                    at = start
                if body > max_bytes:
                    if has_nl:
                        f.seek(end - 1)
                        if f.read(1) != b"\n":
                            raise self._stale(prompts, index, "it does not end in a newline")
                    yield index, TooLong(body, max_bytes)
                    at = -1
                    continue
                if at != start:
                    f.seek(start)
                line = f.read(end - start)
                nl = line.find(b"\n")
                if len(line) != end - start or nl != (len(line) - 1 if has_nl else -1):
                    raise self._stale(prompts, index, "its newlines are not where it says")
                yield index, line
                at = end
