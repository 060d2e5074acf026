"""The forgetting filesystem: a FUSE server (mfusepy over libfuse3) over a Volume in memory.

Run by harness.py as `python -m tests.powerloss.forgetfs MOUNTPOINT --control NAME`: it serves
the mount in the foreground and answers one JSON request per connection on the abstract Unix
socket NAME: ping, stats, power_loss (refused while a file is open) and save_log.

Nothing is cached by the kernel that a power loss could make stale: entry, attribute and
negative timeouts are 0, no writeback cache (every write reaches us when it is made), and the
page cache is dropped at every open (no keep_cache). A power loss is refused while any file is
open, so a read after one always opens anew. direct_io is a choice: off by default, because
it refuses shared mmap (safetensors and torch checkpoints map their files).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import functools
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # mfusepy would pick libfuse2 first
import mfusepy

from tests.powerloss import oplog
from tests.powerloss.volume import FsError, Inode, Volume

FUSE_CAP_WRITEBACK_CACHE = 1 << 16
RENAME_NOREPLACE = 1
O_SYNCS = os.O_SYNC | os.O_DSYNC

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Handle:
    ino: int
    flags: int


def locked(method: F) -> F:
    """One operation at a time (the control thread shares the volume); an error that is not
    the system call's own is counted and printed, then returned as EIO."""

    @functools.wraps(method)
    def run(self: ForgetFS, *args: Any) -> Any:
        with self._mutex:
            try:
                return method(self, *args)
            except OSError:
                raise
            except Exception:
                self.internal_errors += 1
                traceback.print_exc()
                raise FsError(errno.EIO, f"forgetfs internal error in {method.__name__}") from None

    return run  # type: ignore[return-value]


class ForgetFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, volume: Volume, direct_io: bool) -> None:
        self.vol = volume
        self.direct_io = direct_io
        self._mutex = threading.Lock()
        self.handles: dict[int, Handle] = {}
        self.next_fh = 1
        self.internal_errors = 0

    def init_with_config(self, conn: Any, config: Any) -> None:
        config.entry_timeout = config.attr_timeout = config.negative_timeout = 0.0
        config.hard_remove = 1  # an unlinked open file is not renamed to .fuse_hidden*
        config.use_ino = config.readdir_ino = 1
        config.direct_io = int(self.direct_io)
        config.kernel_cache = config.auto_cache = 0
        conn.want &= ~FUSE_CAP_WRITEBACK_CACHE

    # -- helpers ---------------------------------------------------------------------------

    def _split(self, path: str) -> tuple[int, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        return self.vol.resolve(head).ino, name

    def _node(self, path: str | None, fh: int | None) -> Inode:
        if fh is not None and fh in self.handles:
            return self.vol.get(self.handles[fh].ino)
        if path is None:
            raise FsError(errno.EBADF, "no path and no open file")
        return self.vol.resolve(path)

    def _handle(self, ino: int, flags: int) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = Handle(ino, flags)
        return fh

    def _attrs(self, node: Inode) -> dict[str, int]:
        size = len(node.data)
        return {
            "st_mode": node.mode, "st_ino": node.ino, "st_nlink": self.vol.nlink(node),
            "st_size": size, "st_blocks": (size + 511) // 512, "st_blksize": 4096,
            "st_uid": node.uid, "st_gid": node.gid, "st_atime": node.atime_ns,
            "st_mtime": node.mtime_ns, "st_ctime": node.ctime_ns,
        }

    def _owner(self, ino: int) -> None:
        uid, gid, _ = mfusepy.fuse_get_context()
        node = self.vol.get(ino)
        node.uid, node.gid = uid, gid

    # -- attributes and lookups ----------------------------------------------------------

    @locked
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        return self._attrs(self._node(path, fh))

    @locked
    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 24, "f_bfree": 1 << 23,
                "f_bavail": 1 << 23, "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 255}

    @locked
    def chmod(self, path: str | None, mode: int) -> None:
        self.vol.chmod(self._node(path, None).ino, mode)

    @locked
    def chown(self, path: str | None, uid: int, gid: int) -> None:
        node = self._node(path, None)
        if uid != -1:
            node.uid = uid
        if gid != -1:
            node.gid = gid
        node.ctime_ns = time.time_ns()

    @locked
    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> None:
        node = self._node(path, None)
        now = time.time_ns()
        node.atime_ns, node.mtime_ns = times if times is not None else (now, now)
        node.ctime_ns = now

    # -- directories ---------------------------------------------------------------------

    @locked
    def opendir(self, path: str) -> int:
        return self._handle(self.vol.resolve(path).ino, os.O_RDONLY)

    @locked
    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        node = self._node(path, fh)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR, str(path))
        out = [(".", {"st_mode": node.mode, "st_ino": node.ino}, 0),
               ("..", {"st_mode": stat.S_IFDIR}, 0)]
        for name, ino in node.entries.items():
            child = self.vol.inodes[ino]
            out.append((name, {"st_mode": child.mode, "st_ino": ino}, 0))
        return out

    @locked
    def releasedir(self, path: str | None, fh: int) -> None:
        self.handles.pop(fh, None)

    @locked
    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> None:
        self.vol.fsyncdir(self._node(path, fh).ino)

    @locked
    def mkdir(self, path: str, mode: int) -> None:
        parent, name = self._split(path)
        self._owner(self.vol.mkdir(parent, name, mode))

    @locked
    def rmdir(self, path: str) -> None:
        self.vol.rmdir(*self._split(path))

    @locked
    def unlink(self, path: str) -> None:
        self.vol.unlink(*self._split(path))

    @locked
    def rename(self, old: str, new: str, flags: int = 0) -> None:
        if flags & ~RENAME_NOREPLACE:
            raise FsError(errno.EINVAL, f"rename flags {flags:#x} (only RENAME_NOREPLACE)")
        parent, name = self._split(old)
        new_parent, new_name = self._split(new)
        self.vol.rename(parent, name, new_parent, new_name, noreplace=bool(flags))

    @locked
    def link(self, target: str, source: str) -> None:
        parent, name = self._split(target)
        self.vol.link(self.vol.resolve(source).ino, parent, name)

    # -- files -----------------------------------------------------------------------------

    def _open(self, ino: int, flags: int) -> int:
        if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            self.vol.truncate(ino, 0)
        return self._handle(ino, flags)

    @locked
    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        parent, name = self._split(path)
        existing = self.vol.dir(parent).entries.get(name)
        if existing is not None:  # another process made it since the kernel looked
            if flags & os.O_EXCL:
                raise FsError(errno.EEXIST, path)
            return self._open(self.vol.file(existing).ino, flags)
        ino = self.vol.create(parent, name, mode)
        self._owner(ino)
        return self._handle(ino, flags)

    @locked
    def open(self, path: str, flags: int) -> int:
        node = self.vol.resolve(path)
        if node.is_dir:
            raise FsError(errno.EISDIR, path)
        return self._open(node.ino, flags)

    @locked
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        node = self._node(path, fh)
        node.atime_ns = time.time_ns()
        return bytes(node.data[offset:offset + size])

    @locked
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        h = self.handles[fh]
        if h.flags & os.O_APPEND:
            offset = len(self.vol.file(h.ino).data)
        n = self.vol.write(h.ino, offset, data)
        if h.flags & O_SYNCS:
            self.vol.fsync(h.ino)
        return n

    @locked
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> None:
        self.vol.truncate(self._node(path, fh).ino, length)

    @locked
    def flush(self, path: str | None, fh: int) -> None:
        pass  # close(2) makes nothing durable

    @locked
    def fsync(self, path: str | None, datasync: int, fh: int) -> None:
        self.vol.fsync(self.handles[fh].ino)

    @locked
    def release(self, path: str | None, fh: int) -> None:
        self.handles.pop(fh, None)

    # -- control ---------------------------------------------------------------------------

    def open_files(self) -> list[str]:
        out = []
        for h in self.handles.values():
            where = self.vol.path_of(h.ino)
            out.append(f"/{where}" if where is not None else f"inode {h.ino} (unlinked)")
        return sorted(out)

    def power_loss(self, wait_s: float) -> dict[str, Any]:
        # A SIGKILLed writer's files are released by the kernel a moment after it is reaped.
        deadline = time.monotonic() + wait_s
        while True:
            with self._mutex:
                if not self.handles:
                    before = len(self.vol.log or ())
                    self.vol.power_loss()
                    return {"ok": True, "ops": before}
                if time.monotonic() > deadline:
                    return {"ok": False, "error": "power loss refused: files still open "
                            f"after {wait_s:g} s (kill -9 the processes using the mount "
                            f"first): {', '.join(self.open_files()[:20])}"}
            time.sleep(0.01)

    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        cmd = request.get("cmd")
        if cmd == "power_loss":
            return self.power_loss(float(request.get("wait_s", 10.0)))
        with self._mutex:
            if cmd == "ping":
                return {"ok": True, "pid": os.getpid()}
            if cmd == "stats":
                return {"ok": True, "ops": len(self.vol.log or ()), "open": self.open_files(),
                        "internal_errors": self.internal_errors}
            if cmd == "save_log":
                if self.vol.log is None:
                    return {"ok": False, "error": "mounted without an operation log"}
                oplog.save(self.vol.log, Path(request["folder"]))
                return {"ok": True, "ops": len(self.vol.log)}
        return {"ok": False, "error": f"unknown request {request!r}"}


class Fuse3(mfusepy.FUSE):
    """mfusepy's libfuse3 wrappers, with what they drop: truncate gets the open file (an
    ftruncate of an unlinked file has no path) and rename gets its flags."""

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        decoded = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.truncate(decoded, length, fh)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(
            old.decode(self.encoding, self.errors), new.decode(self.encoding, self.errors), flags)


def serve_control(fs: ForgetFS, name: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("\0" + name)
    sock.listen(8)
    while True:
        conn, _ = sock.accept()
        with conn, conn.makefile("rwb") as f:
            try:
                reply = fs.control(json.loads(f.readline()))
            except Exception as exc:
                traceback.print_exc()
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            f.write(json.dumps(reply).encode() + b"\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="forgetfs", description=__doc__)
    p.add_argument("mountpoint")
    p.add_argument("--control", required=True, help="abstract Unix socket name")
    p.add_argument("--direct-io", action="store_true")
    p.add_argument("--no-log", action="store_true", help="keep no operation log")
    args = p.parse_args(argv)
    if mfusepy.fuse_version_major != 3:
        print(f"forgetfs: libfuse {mfusepy.fuse_version_major} found, libfuse3 needed",
              file=sys.stderr)
        return 2
    # Gone with the test that started us: libfuse unmounts on SIGTERM.
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    fs = ForgetFS(Volume(log=None if args.no_log else []), direct_io=args.direct_io)
    threading.Thread(target=serve_control, args=(fs, args.control), daemon=True).start()
    # Mode bits checked by the kernel; root lets other users in (tests may run some).
    Fuse3(fs, args.mountpoint, foreground=True, nothreads=True, fsname="forgetfs",
          default_permissions=True, allow_other=os.getuid() == 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
