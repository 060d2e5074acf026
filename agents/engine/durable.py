"""Appends that are all or nothing: a line file the engine appends to (a batch, .done_indices,
failures.jsonl, uploads.jsonl, ownership.jsonl) is cut back to its last durable size when a
write or its fsync fails, before the error goes on. A full disk (ENOSPC), a file over its size
limit (EFBIG) or a failing device then leaves no half line for the next append to glue onto.
Opening one fsyncs its folder: a new file's name survives a power loss before its first
append is called durable (one folder fsync per file opened, none per append).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from agents.rundir.atomic import fsync_dir
from agents.rundir.crashpoint import write_all

log = logging.getLogger("fleetdeck.engine")


class TornFile(OSError):
    """The file could not be cut back after a failed write: appending is refused until a
    restart's recovery mends it (it cuts the torn tail)."""


class DurableAppend:
    """An O_APPEND file and its durable size (what the last successful fsync covered)."""

    def __init__(self, path: Path, fault_point: str) -> None:
        self.path = path
        self.point = fault_point
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # Also when the file was there: whoever created it may have died before this.
            fsync_dir(path.parent)
        except OSError:
            os.close(self.fd)
            raise
        self.durable = os.fstat(self.fd).st_size
        self.size = self.durable  # written so far, durable or not
        self.torn = False

    def _refuse_if_torn(self) -> None:
        if self.torn:
            raise TornFile(errno.EIO, f"{self.path}: a failed write left a torn tail that "
                           "could not be cut; restart the engine to mend it")

    def write(self, data: bytes) -> None:
        """Write all of `data` (not yet durable: `sync` makes it so); on failure cut back."""
        self._refuse_if_torn()
        try:
            write_all(self.fd, data, self.point)
        except OSError:
            self.cut_back()
            raise
        self.size += len(data)

    def sync(self) -> None:
        """fsync; what was written is now the durable size. On failure cut back."""
        self._refuse_if_torn()
        try:
            os.fsync(self.fd)
        except OSError:
            self.cut_back()
            raise
        self.durable = self.size

    def append(self, data: bytes) -> None:
        """Write and fsync, or leave the file as it was."""
        self.write(data)
        self.sync()

    def cut_back(self, size: int | None = None) -> bool:
        """Truncate to `size` (the durable size by default) and fsync; False, and the file is
        marked torn, when even that fails."""
        size = self.durable if size is None else size
        try:
            os.ftruncate(self.fd, size)
            os.fsync(self.fd)
        except OSError as exc:
            self.torn = True
            log.error("%s: cannot cut back to %d bytes after a failed write: %s", self.path,
                      size, exc)
            return False
        self.durable = self.size = size
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
