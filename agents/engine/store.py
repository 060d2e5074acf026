"""The batch store: completion lines on disk, crash-safe by group commit.

A group of lines is written to the open `.partial` batch and fsynced, then their indices are
appended to `.done_indices` and fsynced; when any of that fails (a full disk), both files are
cut back to where they were before the group, so a batch never holds a line that
`.done_indices` lacks when it closes. A full batch is renamed to `.jsonl` and the folder
fsynced. Every new name is fsynced into its folder before anything in it is called durable:
`completions/` into the run dir at recovery, `.done_indices` and each `.partial` when opened
(durable.py). Recovery reads `.done_indices` and the open `.partial` only, never closed
batches. All methods block (fsync): the engine calls them from one worker thread.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from agents.engine.doneset import DoneSet
from agents.engine.durable import DurableAppend, TornFile
from agents.rundir.atomic import cut_torn_tail, fsync_dir, make_dirs
from agents.rundir.batchnames import batch_name, parse_batch_name
from agents.rundir.crashpoint import crash_point
from agents.rundir.schema import line_key_decoder


def parse_done_line(raw: bytes) -> tuple[int, int] | None:
    """A `.done_indices` line: `index` or `index attempt`; None for a blank line; ValueError
    for anything else."""
    parts = raw.split()
    if not parts:
        return None
    if len(parts) > 2:
        raise ValueError("more than two fields")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 1


@dataclass(frozen=True, slots=True)
class ClosedBatch:
    path: Path
    size: int
    sha256: str
    lines: int


@dataclass(slots=True)
class Recovery:
    """What recovery found and mended, for the log and for progress."""

    done: int = 0
    open_batch_lines: int = 0
    torn_bytes_cut: int = 0
    recorded_after_crash: int = 0
    next_batch: int = 0
    closed_batches: list[Path] = field(default_factory=list)


class StoreError(RuntimeError):
    pass


class BatchStore:
    def __init__(self, run_dir: Path, batch_size: int, total: int) -> None:
        self.folder = run_dir / "completions"
        self.batch_size = batch_size
        self.done = DoneSet(total)
        self._number = 0
        self._partial: Path | None = None
        self._batch: DurableAppend | None = None
        self._lines = 0
        self._size = 0
        self._hash = hashlib.sha256()
        self._done_file: DurableAppend | None = None
        # Lines in the open batch that may lack their .done_indices record (a failed group
        # could not be cut back): the batch must not close; a restart's recovery records them.
        self._unrecorded = False
        # Batches a failed write_group closed before it failed (the caller still owns them).
        self.closed_in_failed_group: list[ClosedBatch] = []

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> Recovery:
        make_dirs(self.folder)
        rec = Recovery()
        done_path = self.folder / ".done_indices"
        rec.torn_bytes_cut += cut_torn_tail(done_path)
        if done_path.exists():
            with open(done_path, "rb") as f:
                for lineno, raw in enumerate(f, 1):
                    try:
                        done = parse_done_line(raw)
                        if done is not None:
                            self.done.add(*done)
                    except (ValueError, IndexError) as exc:
                        raise StoreError(
                            f"{done_path}:{lineno}: not an index: {raw!r} ({exc})"
                        ) from None
        partials: list[tuple[int, Path]] = []
        highest = -1
        for entry in os.scandir(self.folder):
            b = parse_batch_name(entry.name)
            if b is None:
                continue
            number = b.number
            highest = max(highest, number)
            if b.open:
                partials.append((number, Path(entry.path)))
            else:
                rec.closed_batches.append(Path(entry.path))
        rec.closed_batches.sort()
        if len(partials) > 1:
            names = ", ".join(str(p) for _, p in sorted(partials))
            raise StoreError(f"more than one open batch in {self.folder}: {names}")
        self._done_file = DurableAppend(done_path, "record")
        if partials:
            number, path = partials[0]
            rec.torn_bytes_cut += cut_torn_tail(path)
            unrecorded: list[tuple[int, int]] = []
            with open(path, "rb") as f:
                for lineno, raw in enumerate(f, 1):
                    try:
                        key = line_key_decoder.decode(raw)
                    except msgspec.DecodeError as exc:
                        raise StoreError(f"{path}:{lineno}: unreadable batch line: {exc}") from None
                    if not self.done.has(key.index, key.attempt):
                        unrecorded.append((key.index, key.attempt))
                    self._hash.update(raw)
                    self._size += len(raw)
                    self._lines += 1
            if unrecorded:
                self._record(unrecorded)
                rec.recorded_after_crash = len(unrecorded)
            self._number = number
            self._open(path)
            if self._lines >= self.batch_size:
                # Crashed between the last group of a full batch and its close.
                rec.closed_batches.append(self.close_batch().path)
        else:
            self._number = highest + 1
        rec.done = len(self.done)
        rec.open_batch_lines = self._lines
        rec.next_batch = self._number
        return rec

    def lines_from(self, number: int, skip: int,
                   missing: list[str] | None = None) -> Iterator[tuple[Path, int, bytes]]:
        """After recover(): every line written from line `skip` of batch `number` on, in the
        order written (what a count taken at that point has not seen), as (file, line
        number, line). StoreError when the
        store holds less than that point; a closed batch that is gone from the folder is
        named in `missing` (or is a StoreError without it)."""
        end = (self._number, self._lines)
        if (number, skip) > end:
            raise StoreError(f"{self.folder}: holds batches up to {end[0]} (line {end[1]}), "
                             f"not batch {number} line {skip}")
        for n in range(number, self._number + 1):
            if n == self._number:
                if self._partial is None:
                    return
                path = self._partial
            else:
                path = self.folder / batch_name(n)
            seen = 0
            try:
                with open(path, "rb") as f:
                    for raw in f:
                        seen += 1
                        if n > number or seen > skip:
                            yield path, seen, raw
            except FileNotFoundError:
                if missing is None or (n == number and skip):
                    raise StoreError(f"{path}: missing, so its lines cannot be counted") \
                        from None
                missing.append(path.name)
                continue
            if n == number and seen < skip:
                raise StoreError(f"{path}: {seen} lines, not the {skip} counted before")

    # -- writing ----------------------------------------------------------------------------

    def _open(self, path: Path) -> None:
        self._partial = path
        self._batch = DurableAppend(path, "write_group")

    def _ensure_open(self) -> DurableAppend:
        if self._batch is None:
            self._open(self.folder / batch_name(self._number, open=True))
            self._lines = 0
            self._size = 0
            self._hash = hashlib.sha256()
        assert self._batch is not None
        return self._batch

    def _record(self, keys: list[tuple[int, int]]) -> None:
        """Append the keys to .done_indices durably (or leave it as it was), then to the
        done-set."""
        assert self._done_file is not None
        buf = "".join(f"{i}\n" if a <= 1 else f"{i} {a}\n" for i, a in keys).encode()
        self._done_file.append(buf)
        for index, attempt in keys:
            self.done.add(index, attempt)

    def write_group(self, lines: list[tuple[int, int, bytes]]) -> list[ClosedBatch]:
        """Durably store (index, attempt, encoded line) items; returns batches it closed.

        All or nothing per batch: when a write, an fsync or the record fails (a full disk),
        the open batch and .done_indices are cut back to where they were before this group's
        piece, then the error goes on. Pieces that filled and closed a batch before the
        failure stay committed (`closed_in_failed_group`)."""
        closed: list[ClosedBatch] = []
        self.closed_in_failed_group = []
        pos = 0
        while pos < len(lines):
            if self._unrecorded:
                raise TornFile(errno.EIO, f"{self._partial}: not written to since a failed "
                               "write could not be cut back; restart the engine to mend it")
            batch = self._ensure_open()
            room = self.batch_size - self._lines
            piece = lines[pos : pos + room]
            pos += len(piece)
            data = b"".join(raw for _, _, raw in piece)
            start = batch.durable
            try:
                batch.write(data)
                crash_point("lines_written")
                batch.sync()
                crash_point("lines_fsynced")
                self._record([(i, a) for i, a, _ in piece])
            except OSError:
                # The batch cut itself back on a failed write or fsync; a failed record
                # leaves these lines durable but unrecorded: cut them too, unless
                # .done_indices itself could not be cut back (it may then hold their keys).
                assert self._done_file is not None
                if batch.durable != start and (self._done_file.torn
                                               or not batch.cut_back(start)):
                    self._unrecorded = True
                if batch.torn:
                    self._unrecorded = True
                self.closed_in_failed_group = closed
                raise
            self._hash.update(data)
            self._size += len(data)
            self._lines += len(piece)
            if self._lines >= self.batch_size:
                closed.append(self.close_batch())
        return closed

    def close_batch(self) -> ClosedBatch:
        """Close the open batch (also a short one, at stop or at the end)."""
        if self._batch is None or self._partial is None:
            raise StoreError("no open batch to close")
        if self._unrecorded:
            raise TornFile(errno.EIO, f"{self._partial}: left open, not closed: a failed write "
                           "could not be cut back, so lines in it may lack their .done_indices "
                           "record; the next start's recovery records them")
        self._batch.sync()
        self._batch.close()
        self._batch = None
        final = self._partial.with_suffix("")  # drop ".partial"
        os.replace(self._partial, final)
        crash_point("batch_close")
        fsync_dir(self.folder)
        batch = ClosedBatch(final, self._size, self._hash.hexdigest(), self._lines)
        self._partial = None
        self._number += 1
        self._lines = 0
        self._size = 0
        self._hash = hashlib.sha256()
        return batch

    def close_open_batch(self) -> ClosedBatch | None:
        """At stop or end: close a non-empty open batch; drop an empty one."""
        if self._batch is None or self._partial is None:
            return None
        if self._lines == 0 and not self._unrecorded:
            self._batch.close()
            self._batch = None
            os.unlink(self._partial)
            self._partial = None
            return None
        return self.close_batch()

    @property
    def open_lines(self) -> int:
        return self._lines

    @property
    def next_number(self) -> int:
        return self._number

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
            self._batch = None
        if self._done_file is not None:
            self._done_file.close()
            self._done_file = None
