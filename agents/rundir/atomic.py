"""Durable file writes: atomic replace (temp + fsync + os.replace) and fsynced appends."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Readers see the old file or the new one, never a half-written one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A full disk (or a kill between write and replace): no half-written temp file left
        # to hold the space the next write needs.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


class AppendLog:
    """An append-only file with explicit durability: append() then sync()."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()

    def append(self, data: bytes) -> None:
        self._f.write(data)

    def sync(self) -> None:
        os.fsync(self._f.fileno())

    def append_durable(self, data: bytes) -> None:
        self._f.write(data)
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def cut_torn_tail(path: Path) -> int:
    """Truncate a line file after its last newline (a crash may leave half a line).

    Returns the number of bytes cut.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        # Walk back in chunks to the last newline.
        pos = size
        chunk = 65536
        keep = 0
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            block = f.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        if keep == size:
            return 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep
