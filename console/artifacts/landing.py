"""A pulled part becomes its file: checked against the manifest's sha256, then made durable
(its data fsynced, renamed into place, the folder fsynced), so a power loss after a pull
leaves what it reported.

Many at a time. A pull of a thousand small files spent more on landing them one by one (a
thread hop, an fsync, a rename and a folder fsync each, contending with the receiving threads)
than on moving their bytes. `Lander` lands the files whose checks come due together as one
group, group-commit style: every part checked, their data fsynced side by side (the
filesystem's journal takes concurrent fsyncs in one commit), all renamed, then each folder
fsynced once. Each file is still fsynced itself: `syncfs` would be one call, but it is not a
promise every filesystem keeps (a FUSE one may take it as a no-op).

`Hashed` is a part's sha256 taken while it arrives, so the check reads only what was not
hashed on the way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agents.rundir.atomic import fsync_dir, fsync_file

CHUNK = 4 * 1024 * 1024
# Hashing as a part arrives pays from this size on (smaller ones are read once at the check).
EARLY_MIN = 4 * 1024 * 1024
# Files landed in one group at most, and the fsyncs of a group run this many at once.
GROUP_MAX = 512
FSYNC_THREADS = 8


class Hashed:
    """A part's sha256 taken while it is written: each look hashes what arrived since the
    last (from the page cache, just written) and starts its write-back, so the check at the
    end reads only the tail and the fsync finds little left to write."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.upto = 0

    def more(self, path: Path, limit: int) -> None:
        """Hash from `upto` to the part's size now (at most `limit`). In a thread."""
        try:
            with open(path, "rb") as f:
                end = min(os.fstat(f.fileno()).st_size, limit)
                if end - self.upto < EARLY_MIN:
                    return
                start = self.upto
                self._read(f, end)
                start_writeback(f.fileno(), start, end - start)
        except OSError:
            return  # the part is gone or moved: the check at the end decides

    def finish(self, f: BinaryIO, size: int) -> str | None:
        if self.upto > size:
            return None
        self._read(f, size)
        return self.h.hexdigest()

    def _read(self, f: BinaryIO, end: int) -> None:
        f.seek(self.upto)
        while self.upto < end:
            chunk = f.read(min(CHUNK, end - self.upto))
            if not chunk:
                break
            self.h.update(chunk)
            self.upto += len(chunk)


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range() if sys.platform.startswith("linux") else None
SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing these pages to disk now, without waiting (Linux's
    sync_file_range): the fsync at the end then waits for little. Not a durability step."""
    if _SYNC_FILE_RANGE is not None and length > 0:
        _SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE)


@dataclass(eq=False)
class Landing:
    """One part to land: where it is, where it goes, what the manifest says of it."""

    part: Path
    final: Path
    size: int
    sha256: str | None
    early: Hashed | None = None


def _checked(item: Landing) -> bool:
    """The part cut to the manifest's size (a log still growing on the node comes longer; the
    manifest's sha256 is of its first `size` bytes) and hashed; a mismatch is deleted. The
    early hash's bytes were read as the fetcher wrote them, so where it does not match (a hole
    sftp filled later) the whole part is hashed again before it is refused."""
    with open(item.part, "r+b") as f:
        if os.fstat(f.fileno()).st_size > item.size:
            f.truncate(item.size)
        early = item.early
        ok = early is not None and early.finish(f, item.size) == item.sha256
        if not ok:
            f.seek(0)
            ok = hashlib.file_digest(f, "sha256").hexdigest() == item.sha256
    if not ok:
        item.part.unlink()
    return ok


_FSYNCS: concurrent.futures.ThreadPoolExecutor | None = None


def _fsync_all(paths: list[Path]) -> list[OSError | None]:
    """fsync each file, several at once when there are several."""
    global _FSYNCS
    if len(paths) == 1:
        try:
            fsync_file(paths[0])
            return [None]
        except OSError as exc:
            return [exc]
    if _FSYNCS is None:
        _FSYNCS = concurrent.futures.ThreadPoolExecutor(FSYNC_THREADS,
                                                        thread_name_prefix="fd-fsync")
    futures = [_FSYNCS.submit(fsync_file, p) for p in paths]
    out: list[OSError | None] = []
    for fut in futures:
        trouble = fut.exception()
        if trouble is not None and not isinstance(trouble, OSError):
            raise trouble
        out.append(trouble)
    return out


def land_group(items: list[Landing]) -> list[bool | OSError]:
    """Land each part (blocking): True once it is its file, durably; False when its sha256
    differed (the part deleted); the OSError that stopped it otherwise. One file's trouble
    leaves the others to land."""
    out: list[bool | OSError] = [False] * len(items)
    good: list[int] = []
    for k, item in enumerate(items):
        try:
            if _checked(item):
                good.append(k)
        except OSError as exc:
            out[k] = exc
    synced = _fsync_all([items[k].part for k in good])
    renamed: list[int] = []
    for k, unsynced in zip(good, synced, strict=True):
        if unsynced is not None:
            out[k] = unsynced
            continue
        try:
            os.replace(items[k].part, items[k].final)
            renamed.append(k)
        except OSError as exc:
            out[k] = exc
    folders: dict[Path, list[int]] = {}
    for k in renamed:
        folders.setdefault(items[k].final.parent, []).append(k)
        if items[k].part.parent != items[k].final.parent:
            folders.setdefault(items[k].part.parent, []).append(k)
    failed: dict[int, OSError] = {}
    for folder, ks in folders.items():
        try:
            fsync_dir(folder)
        except OSError as exc:
            failed.update((k, exc) for k in ks)
    for k in renamed:
        out[k] = failed.get(k, True)
    return out


def finish_part(part: Path, final: Path, size: int, sha256: str | None,
                early: Hashed | None = None) -> bool:
    """Land one part (blocking): True once it is the file, durably; False on a mismatch (the
    part deleted); OSError raised."""
    (got,) = land_group([Landing(part, final, size, sha256, early)])
    if isinstance(got, OSError):
        raise got
    return got


class Lander:
    """Lands parts as their checks come due: while one group lands (in a thread), the parts
    that come due wait and then land together as the next."""

    def __init__(self) -> None:
        self._waiting: list[tuple[Landing, asyncio.Future[bool | OSError]]] = []
        self._task: asyncio.Task[None] | None = None

    async def land(self, item: Landing) -> bool:
        """True once the part is its file, durably; False on a mismatch; OSError raised."""
        fut: asyncio.Future[bool | OSError] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        got = await fut
        if isinstance(got, OSError):
            raise got
        return got

    async def _run(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting[:GROUP_MAX], self._waiting[GROUP_MAX:]
            try:
                results = await asyncio.to_thread(land_group, [item for item, _ in group])
            except BaseException as exc:
                for _, fut in group:
                    if fut.done():
                        continue
                    if isinstance(exc, Exception):
                        fut.set_exception(exc)
                    else:  # the lander itself cancelled: its waiters are, too
                        fut.cancel()
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, fut), got in zip(group, results, strict=True):
                if not fut.done():
                    fut.set_result(got)
