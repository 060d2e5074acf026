"""The forgetting filesystem's state, in memory: what processes see, and what is durable.

A file's durable content is its content as of its last fsync (size included; a new file's is
empty). A directory's durable entries are its entries as of its last fsync (a new directory's:
none). `power_loss` replaces what processes see by what is durable, so a create, rename, unlink
or mkdir is kept only once its directory was fsynced. The FUSE server (forgetfs.py) and the
crash-state replay (crash.py) run this same code; every change is recorded as an `Op`.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.powerloss.oplog import Op

ROOT = 1


class FsError(OSError):
    def __init__(self, code: int, what: str) -> None:
        super().__init__(code, f"{os.strerror(code)}: {what}")


@dataclass
class Inode:
    ino: int
    mode: int  # file type and permission bits
    data: bytearray = field(default_factory=bytearray)
    # Files: the durable content is data[:synced_len] while `synced` is None (nothing but
    # appends since the last fsync, so the append + fsync path never copies), else `synced`.
    synced_len: int = 0
    synced: bytes | None = None
    # Directories: what processes see, and what a power loss leaves.
    entries: dict[str, int] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)
    parent: int = 0  # directories: the current parent (rename into one's own subtree is refused)
    nlink: int = 0  # files: current names
    uid: int = 0
    gid: int = 0
    atime_ns: int = field(default_factory=time.time_ns)
    mtime_ns: int = field(default_factory=time.time_ns)
    ctime_ns: int = field(default_factory=time.time_ns)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    def durable_data(self) -> bytes:
        return bytes(self.data[:self.synced_len]) if self.synced is None else self.synced

    def keep_durable_before_change(self, start: int) -> None:
        """Bytes from `start` on are about to change: copy the durable content first if the
        change reaches into it."""
        if self.synced is None and start < self.synced_len:
            self.synced = bytes(self.data[:self.synced_len])

    def touch(self) -> None:
        self.mtime_ns = self.ctime_ns = time.time_ns()


class Volume:
    """Inodes with current and durable state. Methods take inode numbers and names, raise
    FsError as the system call would, and record each change (only changes) in `log`."""

    def __init__(self, log: list[Op] | None = None) -> None:
        self.inodes: dict[int, Inode] = {ROOT: Inode(ROOT, stat.S_IFDIR | 0o755, parent=ROOT)}
        self.next_ino = ROOT + 1
        self.log = log
        self._apply: dict[str, Callable[..., object]] = {
            "create": self.create, "mkdir": self.mkdir, "write": self.write,
            "truncate": self.truncate, "fsync": self.fsync, "fsyncdir": self.fsyncdir,
            "rename": self.rename, "unlink": self.unlink, "rmdir": self.rmdir,
            "link": self.link, "chmod": self.chmod, "power_loss": self.power_loss,
        }

    def _record(self, kind: str, *args: int | str | bytes) -> None:
        if self.log is not None:
            self.log.append(Op(kind, args))

    def apply(self, op: Op) -> None:
        self._apply[op.kind](*op.args)

    # -- looking up (what processes see) -------------------------------------------------

    def get(self, ino: int) -> Inode:
        try:
            return self.inodes[ino]
        except KeyError:
            raise FsError(errno.ESTALE, f"inode {ino}") from None

    def dir(self, ino: int) -> Inode:
        node = self.get(ino)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR, f"inode {ino}")
        return node

    def file(self, ino: int) -> Inode:
        node = self.get(ino)
        if node.is_dir:
            raise FsError(errno.EISDIR, f"inode {ino}")
        return node

    def child(self, parent: int, name: str) -> Inode:
        try:
            return self.inodes[self.dir(parent).entries[name]]
        except KeyError:
            raise FsError(errno.ENOENT, name) from None

    def resolve(self, path: str) -> Inode:
        """An absolute path inside the volume ("/" is the root)."""
        node = self.inodes[ROOT]
        for name in path.split("/"):
            if name:
                node = self.child(node.ino, name)
        return node

    def nlink(self, node: Inode) -> int:
        if node.is_dir:
            return 2 + sum(self.inodes[c].is_dir for c in node.entries.values())
        return node.nlink

    def path_of(self, ino: int) -> str | None:
        """A current path of `ino` (for messages), None when it has no name now."""
        for path, node in self.walk(durable=False):
            if node.ino == ino:
                return path
        return None

    # -- changes ---------------------------------------------------------------------------

    def _new_name(self, parent: int, name: str) -> Inode:
        d = self.dir(parent)
        if not name or "/" in name or name in (".", ".."):
            raise FsError(errno.EINVAL, repr(name))
        if name in d.entries:
            raise FsError(errno.EEXIST, name)
        return d

    def _new_inode(self, mode: int) -> Inode:
        node = Inode(self.next_ino, mode)
        self.inodes[node.ino] = node
        self.next_ino += 1
        return node

    def create(self, parent: int, name: str, mode: int) -> int:
        d = self._new_name(parent, name)
        node = self._new_inode(stat.S_IFREG | stat.S_IMODE(mode))
        d.entries[name] = node.ino
        node.nlink = 1
        d.touch()
        self._record("create", parent, name, mode)
        return node.ino

    def mkdir(self, parent: int, name: str, mode: int) -> int:
        d = self._new_name(parent, name)
        node = self._new_inode(stat.S_IFDIR | stat.S_IMODE(mode))
        node.parent = parent
        d.entries[name] = node.ino
        d.touch()
        self._record("mkdir", parent, name, mode)
        return node.ino

    def write(self, ino: int, offset: int, data: bytes) -> int:
        node = self.file(ino)
        if offset < 0:
            raise FsError(errno.EINVAL, f"offset {offset}")
        node.keep_durable_before_change(offset)
        if offset > len(node.data):
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset:offset + len(data)] = data
        node.touch()
        self._record("write", ino, offset, data)
        return len(data)

    def truncate(self, ino: int, size: int) -> None:
        node = self.file(ino)
        if size < 0:
            raise FsError(errno.EINVAL, f"size {size}")
        node.keep_durable_before_change(size)
        if size < len(node.data):
            del node.data[size:]
        else:
            node.data.extend(bytes(size - len(node.data)))
        node.touch()
        self._record("truncate", ino, size)

    def fsync(self, ino: int) -> None:
        """fsync or fdatasync of a file: its content, size included, is now durable."""
        node = self.file(ino)
        node.synced, node.synced_len = None, len(node.data)
        self._record("fsync", ino)

    def fsyncdir(self, ino: int) -> None:
        """fsync of a directory: its entries as they are now are durable (not its children's)."""
        node = self.dir(ino)
        node.durable = dict(node.entries)
        self._record("fsyncdir", ino)

    def rename(self, parent: int, name: str, new_parent: int, new_name: str,
               noreplace: bool = False) -> None:
        node = self.child(parent, name)
        dst = self.dir(new_parent)
        if not new_name or "/" in new_name or new_name in (".", ".."):
            raise FsError(errno.EINVAL, repr(new_name))
        old_ino = dst.entries.get(new_name)
        if old_ino == node.ino:
            return  # two names of one file: POSIX says rename does nothing
        if old_ino is not None:
            if noreplace:
                raise FsError(errno.EEXIST, new_name)
            old = self.inodes[old_ino]
            if node.is_dir and not old.is_dir:
                raise FsError(errno.ENOTDIR, new_name)
            if not node.is_dir and old.is_dir:
                raise FsError(errno.EISDIR, new_name)
            if old.is_dir and old.entries:
                raise FsError(errno.ENOTEMPTY, new_name)
        if node.is_dir:
            up = new_parent
            while True:
                if up == node.ino:
                    raise FsError(errno.EINVAL, f"{name} into its own subtree")
                if up == ROOT:
                    break
                up = self.inodes[up].parent
        if old_ino is not None:
            self.inodes[old_ino].nlink -= 1
        del self.inodes[parent].entries[name]
        dst.entries[new_name] = node.ino
        if node.is_dir:
            node.parent = new_parent
        self.inodes[parent].touch()
        dst.touch()
        self._record("rename", parent, name, new_parent, new_name)

    def unlink(self, parent: int, name: str) -> None:
        node = self.child(parent, name)
        if node.is_dir:
            raise FsError(errno.EISDIR, name)
        del self.inodes[parent].entries[name]
        node.nlink -= 1
        node.ctime_ns = time.time_ns()
        self.inodes[parent].touch()
        self._record("unlink", parent, name)

    def rmdir(self, parent: int, name: str) -> None:
        node = self.child(parent, name)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR, name)
        if node.entries:
            raise FsError(errno.ENOTEMPTY, name)
        del self.inodes[parent].entries[name]
        self.inodes[parent].touch()
        self._record("rmdir", parent, name)

    def link(self, ino: int, parent: int, name: str) -> None:
        node = self.get(ino)
        if node.is_dir:
            raise FsError(errno.EPERM, f"a hard link to directory {name}")
        d = self._new_name(parent, name)
        d.entries[name] = ino
        node.nlink += 1
        node.ctime_ns = time.time_ns()
        d.touch()
        self._record("link", ino, parent, name)

    def chmod(self, ino: int, mode: int) -> None:
        """Permission bits are not modelled as durable: a chmod survives a power loss."""
        node = self.get(ino)
        node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
        node.ctime_ns = time.time_ns()
        self._record("chmod", ino, mode)

    # -- the power loss ----------------------------------------------------------------------

    def surviving(self) -> dict[int, dict[str, int]]:
        """What a power loss leaves: each reachable directory's durable entries, found breadth
        first from the root in name order. A directory met a second time (a directory renamed
        across directories with only one of them fsynced, or a cycle such renames can make) is
        dropped from the later entry, as fsck would; a file with several names keeps them all
        (hard links)."""
        dirs: dict[int, dict[str, int]] = {ROOT: {}}
        queue = deque([ROOT])
        while queue:
            d = queue.popleft()
            kept = {}
            for name, ino in sorted(self.inodes[d].durable.items()):
                if self.inodes[ino].is_dir:
                    if ino in dirs:
                        continue
                    dirs[ino] = {}
                    queue.append(ino)
                kept[name] = ino
            dirs[d] = kept
        return dirs

    def power_loss(self) -> None:
        dirs = self.surviving()
        files: dict[int, int] = {}  # ino -> names
        for d, entries in dirs.items():
            node = self.inodes[d]
            node.entries, node.durable = dict(entries), dict(entries)
            for ino in entries.values():
                if self.inodes[ino].is_dir:
                    self.inodes[ino].parent = d
                else:
                    files[ino] = files.get(ino, 0) + 1
        for ino, names in files.items():
            node = self.inodes[ino]
            node.data = bytearray(node.durable_data())
            node.synced, node.synced_len = None, len(node.data)
            node.nlink = names
        self.inodes = {ino: self.inodes[ino] for ino in [*dirs, *files]}
        self._record("power_loss")

    # -- the tree, and a copy of it on a real disk -------------------------------------------

    def walk(self, durable: bool) -> Iterator[tuple[str, Inode]]:
        """(relative path, inode) of every name below the root, parents first: what processes
        see now, or (durable=True) what a power loss would leave."""
        dirs = self.surviving() if durable else None
        stack = [("", ROOT)]
        while stack:
            prefix, d = stack.pop()
            entries = dirs[d] if dirs is not None else self.inodes[d].entries
            for name, ino in sorted(entries.items()):
                node = self.inodes[ino]
                path = f"{prefix}{name}"
                yield path, node
                if node.is_dir:
                    stack.append((path + "/", ino))

    def materialize(self, into: Path, durable: bool = True) -> None:
        """Write the tree to `into` (a new folder on a real disk): the state a power loss now
        would leave (durable=True), or what processes see now."""
        into.mkdir(parents=True)
        first_name: dict[int, Path] = {}
        modes: list[tuple[Path, int]] = []
        for rel, node in self.walk(durable):
            path = into / rel
            if node.is_dir:
                path.mkdir()
            elif node.ino in first_name:
                os.link(first_name[node.ino], path)
                continue
            else:
                first_name[node.ino] = path
                path.write_bytes(node.durable_data() if durable else bytes(node.data))
            modes.append((path, stat.S_IMODE(node.mode)))
        # Modes last, deepest first: a read-only directory would refuse what goes inside.
        for path, mode in reversed(modes):
            os.chmod(path, mode)
