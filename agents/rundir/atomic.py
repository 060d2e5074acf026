"""Durable file writes: atomic replace (temp + fsync + os.replace + folder fsync), fsynced
appends, and the folder fsyncs that make a new name survive a power loss.

A file's data is durable once the file is fsynced; its name (a create, a rename, an unlink, a
mkdir) only once the folder holding it is fsynced. Everything that must outlive a power cut
goes through here: `fsync_dir` is the one folder fsync of the code base.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the names in folder `path` (files created, renamed or removed there) durable."""
    _fsync(path, os.O_DIRECTORY)


def fsync_file(path: Path) -> None:
    """Make the bytes of file `path`, written and closed by whoever, durable."""
    _fsync(path, 0)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """mkdir -p whose folders survive a power loss: each folder it creates is fsynced into
    its parent. An existing folder costs a stat, no fsync."""
    missing: list[Path] = []
    here = path
    while not here.is_dir():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
        fsync_dir(folder.parent)


def replace_durably(src: Path, dst: Path) -> None:
    """os.replace, then fsync the folder it renamed into (and the one it left, when
    another): the new name is what a power loss leaves. `src` must be durable already."""
    os.replace(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Readers see the old file or the new one, never a half-written one, also after a power
    loss: the data is fsynced before the rename, so whichever name survives holds whole
    bytes (a rename can reach the disk before unsynced data: another write's folder fsync,
    or the filesystem's own journal commit, takes it along). durable=False skips the folder
    fsync: a heartbeat rewritten often, which a power loss may turn back to an older version
    (or to none, when it was never durable)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
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


def append_durably(path: Path, data: bytes) -> None:
    """Append `data` to `path` (created if missing) and fsync it, and its folder: an audit
    record that survives a power loss once this returns. One open per call: for appends
    from short-lived processes (a CLI call); a long-lived writer keeps an AppendLog."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    # Whoever created the file may have died before its folder fsync: always, not only when
    # this call created it (a few microseconds on a call that is rare).
    fsync_dir(path.parent)


class AppendLog:
    """An append-only line file with explicit durability: append() then sync(). Opening it
    cuts a torn last line (a crash mid-append) and fsyncs its folder, so its name is durable
    before anything appended to it is called durable."""

    def __init__(self, path: Path) -> None:
        self.path = path
        cut_torn_tail(path)
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        fsync_dir(path.parent)

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
