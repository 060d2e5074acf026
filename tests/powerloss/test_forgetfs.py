"""The forgetting filesystem's rules, through the kernel: what was fsynced survives a power loss
(data by the file's fsync, a name by its directory's), and nothing else does."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.rundir.atomic import atomic_write
from tests.powerloss.harness import ForgetfulDir, mount
from tests.servers.ports import kill_pid, wait_until

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
AT_FDCWD, RENAME_NOREPLACE, RENAME_EXCHANGE = -100, 1, 2


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: Path, data: bytes, sync: bool, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def durable_file(fs: ForgetfulDir, name: str, data: bytes) -> Path:
    """A file whose data and name are both durable."""
    path = fs / name
    write(path, data, sync=True)
    fsync_dir(path.parent)
    return path


def test_a_write_without_fsync_is_gone(forgetful_dir: ForgetfulDir) -> None:
    kept = durable_file(forgetful_dir, "kept", b"")
    write(kept, b"never synced", sync=False)
    write(forgetful_dir / "new", b"never synced either", sync=False)
    assert kept.read_bytes() == b"never synced"  # processes saw it

    forgetful_dir.power_loss()

    assert kept.read_bytes() == b""
    assert kept.stat().st_size == 0
    assert not (forgetful_dir / "new").exists()


def test_a_new_file_needs_its_directory_fsynced(forgetful_dir: ForgetfulDir) -> None:
    write(forgetful_dir / "f", b"data fsynced, name not", sync=True)
    forgetful_dir.power_loss()
    assert not (forgetful_dir / "f").exists()

    write(forgetful_dir / "f", b"data and name fsynced", sync=True)
    fsync_dir(forgetful_dir.path)
    write(forgetful_dir / "late", b"made after the directory's fsync", sync=True)
    forgetful_dir.power_loss()
    assert os.listdir(forgetful_dir) == ["f"]
    assert (forgetful_dir / "f").read_bytes() == b"data and name fsynced"


def test_only_the_synced_prefix_survives(forgetful_dir: ForgetfulDir) -> None:
    path = durable_file(forgetful_dir, "log", b"")
    with open(path, "ab") as f:
        f.write(b"one\n")
        f.flush()
        os.fsync(f.fileno())
        f.write(b"two\n")
        f.flush()
        os.fdatasync(f.fileno())
        f.write(b"three, half")
        f.flush()
    assert path.read_bytes() == b"one\ntwo\nthree, half"

    forgetful_dir.power_loss()

    assert path.read_bytes() == b"one\ntwo\n"
    assert path.stat().st_size == 8


def test_close_and_syncfs_make_nothing_durable(forgetful_dir: ForgetfulDir) -> None:
    path = durable_file(forgetful_dir, "f", b"")
    write(path, b"closed, not fsynced", sync=False)
    fd = os.open(forgetful_dir.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert LIBC.syncfs(fd) == 0  # FUSE forwards no fsync for it
    finally:
        os.close(fd)
    forgetful_dir.power_loss()
    assert path.read_bytes() == b""


def test_truncate_and_extend(forgetful_dir: ForgetfulDir) -> None:
    path = durable_file(forgetful_dir, "f", b"0123456789" * 10)
    os.truncate(path, 10)  # not synced: the 100 bytes come back
    forgetful_dir.power_loss()
    assert path.read_bytes() == b"0123456789" * 10

    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 10)
    os.fsync(fd)
    os.ftruncate(fd, 50)  # an extension not synced
    os.pwrite(fd, b"XX", 2)  # an overwrite inside the synced part, not synced
    os.close(fd)
    assert path.read_bytes() == b"01XX456789" + bytes(40)
    forgetful_dir.power_loss()
    assert path.read_bytes() == b"0123456789"

    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 50)
    os.fsync(fd)
    os.close(fd)
    forgetful_dir.power_loss()
    assert path.read_bytes() == b"0123456789" + bytes(40)


def test_a_rename_over_a_file_is_undone_without_the_directory_fsync(
        forgetful_dir: ForgetfulDir) -> None:
    target = durable_file(forgetful_dir, "state.json", b"old")
    tmp = forgetful_dir / ".state.json.tmp"
    write(tmp, b"new", sync=True)
    fsync_dir(forgetful_dir.path)  # the temp file's name is durable too
    os.replace(tmp, target)
    assert target.read_bytes() == b"new"

    forgetful_dir.power_loss()

    # The old file behind the name, and the temp file under its old name.
    assert target.read_bytes() == b"old"
    assert tmp.read_bytes() == b"new"

    os.replace(tmp, target)
    fsync_dir(forgetful_dir.path)
    forgetful_dir.power_loss()
    assert target.read_bytes() == b"new"
    assert not tmp.exists()


def test_an_unlink_is_undone_without_the_directory_fsync(forgetful_dir: ForgetfulDir) -> None:
    path = durable_file(forgetful_dir, "f", b"synced")
    write(path, b" and not", sync=False, mode="ab")
    path.unlink()
    forgetful_dir.power_loss()
    assert path.read_bytes() == b"synced"  # back, with its durable data only

    path.unlink()
    fsync_dir(forgetful_dir.path)
    forgetful_dir.power_loss()
    assert not path.exists()


def test_mkdir_and_rmdir_need_the_parent_fsynced(forgetful_dir: ForgetfulDir) -> None:
    (forgetful_dir / "new").mkdir()
    old = forgetful_dir / "old"
    old.mkdir()
    fsync_dir(forgetful_dir.path)
    (forgetful_dir / "new2").mkdir()
    old.rmdir()

    forgetful_dir.power_loss()

    assert sorted(os.listdir(forgetful_dir)) == ["new", "old"]


def test_nested_new_directories_need_each_parent_fsynced(forgetful_dir: ForgetfulDir) -> None:
    c = forgetful_dir / "a" / "b" / "c"
    c.mkdir(parents=True)
    write(c / "f", b"deep", sync=True)
    for d in (c, c.parent, c.parent.parent):  # every parent but the root
        fsync_dir(d)
    forgetful_dir.power_loss()
    assert os.listdir(forgetful_dir) == []

    c.mkdir(parents=True)
    write(c / "f", b"deep", sync=True)
    for d in (c, c.parent.parent, forgetful_dir.path):  # all but a/b
        fsync_dir(d)
    forgetful_dir.power_loss()
    assert os.listdir(forgetful_dir / "a" / "b") == []  # b is in a; b's own entries are not

    c.mkdir()
    write(c / "f", b"deep", sync=True)
    for d in (c, c.parent):
        fsync_dir(d)
    forgetful_dir.power_loss()
    assert (c / "f").read_bytes() == b"deep"


def test_a_directory_renamed_into_place(forgetful_dir: ForgetfulDir) -> None:
    """The checkpoint pattern: fill a temp folder, fsync it, rename it over the old one."""
    old = forgetful_dir / "ckpt"
    old.mkdir()
    write(old / "weights", b"v1", sync=True)
    fsync_dir(old)
    fsync_dir(forgetful_dir.path)
    tmp = forgetful_dir / "ckpt.tmp"
    tmp.mkdir()
    write(tmp / "weights", b"v2", sync=True)
    fsync_dir(tmp)
    (old / "weights").unlink()
    old.rmdir()
    os.replace(tmp, old)
    forgetful_dir.power_loss()
    assert (old / "weights").read_bytes() == b"v1"  # no parent fsync: all undone
    assert not tmp.exists()  # and the temp folder's name was never durable

    tmp.mkdir()
    write(tmp / "weights", b"v2", sync=True)
    fsync_dir(tmp)
    fsync_dir(forgetful_dir.path)
    (old / "weights").unlink()
    fsync_dir(old)
    old.rmdir()
    os.replace(tmp, old)
    fsync_dir(forgetful_dir.path)
    forgetful_dir.power_loss()
    assert (old / "weights").read_bytes() == b"v2"
    assert sorted(os.listdir(forgetful_dir)) == ["ckpt"]


@pytest.mark.parametrize(("synced", "left"), [
    ((), {"a/f": b"x"}),
    (("b",), {"a/f": b"x", "b/f": b"x"}),  # the new name only: two names, one file
    (("a",), {}),  # the old name gone only: the file is lost
    (("a", "b"), {"b/f": b"x"}),
])
def test_a_rename_across_directories_is_two_directory_changes(
        forgetful_dir: ForgetfulDir, synced: tuple[str, ...], left: dict[str, bytes]) -> None:
    for d in ("a", "b"):
        (forgetful_dir / d).mkdir()
    durable_file(forgetful_dir, "a/f", b"x")
    fsync_dir(forgetful_dir.path)
    os.rename(forgetful_dir / "a/f", forgetful_dir / "b/f")
    for d in synced:
        fsync_dir(forgetful_dir / d)

    forgetful_dir.power_loss()

    found = {f"{d}/{n}": (forgetful_dir / d / n).read_bytes()
             for d in ("a", "b") for n in os.listdir(forgetful_dir / d)}
    assert found == left
    if len(left) == 2:
        assert os.stat(forgetful_dir / "a/f").st_ino == os.stat(forgetful_dir / "b/f").st_ino


def test_rename_noreplace(forgetful_dir: ForgetfulDir) -> None:
    a, b = durable_file(forgetful_dir, "a", b"a"), durable_file(forgetful_dir, "b", b"b")
    assert LIBC.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_NOREPLACE) == -1
    assert ctypes.get_errno() == errno.EEXIST
    assert LIBC.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) == -1
    assert ctypes.get_errno() == errno.EINVAL  # not supported, and says so
    c = forgetful_dir / "c"
    assert LIBC.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(c), RENAME_NOREPLACE) == 0
    assert c.read_bytes() == b"a" and b.read_bytes() == b"b"


def test_hard_links_are_names_like_any_other(forgetful_dir: ForgetfulDir) -> None:
    f = durable_file(forgetful_dir, "f", b"one file")
    os.link(f, forgetful_dir / "g")
    os.link(f, forgetful_dir / "h")
    fsync_dir(forgetful_dir.path)
    os.link(f, forgetful_dir / "i")
    f.unlink()
    assert os.stat(forgetful_dir / "g").st_nlink == 3

    forgetful_dir.power_loss()

    assert sorted(os.listdir(forgetful_dir)) == ["f", "g", "h"]
    assert os.stat(f).st_nlink == 3
    assert os.stat(f).st_ino == os.stat(forgetful_dir / "h").st_ino


def test_atomic_write_durable_survives(forgetful_dir: ForgetfulDir) -> None:
    path = forgetful_dir / "status.json"
    atomic_write(path, b'{"v": 1}', durable=True)
    forgetful_dir.power_loss()
    assert path.read_bytes() == b'{"v": 1}'

    atomic_write(path, b'{"v": 2}', durable=True)
    forgetful_dir.power_loss()
    assert path.read_bytes() == b'{"v": 2}'
    assert os.listdir(forgetful_dir) == ["status.json"]


def test_atomic_write_not_durable_can_revert(forgetful_dir: ForgetfulDir) -> None:
    new = forgetful_dir / "new.json"
    atomic_write(new, b"first", durable=False)
    forgetful_dir.power_loss()
    assert not new.exists()

    old = forgetful_dir / "old.json"
    atomic_write(old, b"v1", durable=True)
    atomic_write(old, b"v2", durable=False)
    forgetful_dir.power_loss()
    assert old.read_bytes() == b"v1"
    assert os.listdir(forgetful_dir) == ["old.json"]  # no temp file left either

    # A later durable write in the folder fsyncs the name along: its data is whole, since
    # atomic_write fsyncs the data before the rename whatever `durable` says (else this
    # file would be there, empty).
    atomic_write(new, b"first", durable=False)
    atomic_write(old, b"v3", durable=True)
    forgetful_dir.power_loss()
    assert new.read_bytes() == b"first"


def test_o_append(forgetful_dir: ForgetfulDir) -> None:
    path = forgetful_dir / "journal.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    fsync_dir(forgetful_dir.path)
    os.write(fd, b"1\n")
    os.write(fd, b"2\n")
    os.fsync(fd)
    os.write(fd, b"3\n")
    os.close(fd)
    forgetful_dir.power_loss()
    assert path.read_bytes() == b"1\n2\n"

    # Appending again lands after the reverted end (the kernel's size is not stale).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"4\n")
    os.fsync(fd)
    os.close(fd)
    assert path.read_bytes() == b"1\n2\n4\n"
    forgetful_dir.power_loss()
    assert path.read_bytes() == b"1\n2\n4\n"


def test_o_sync_and_o_dsync_writes_are_durable(forgetful_dir: ForgetfulDir) -> None:
    for name, flag in (("sync", os.O_SYNC), ("dsync", os.O_DSYNC)):
        fd = os.open(forgetful_dir / name, os.O_WRONLY | os.O_CREAT | flag, 0o644)
        os.write(fd, b"at once")
        os.close(fd)
    fsync_dir(forgetful_dir.path)
    forgetful_dir.power_loss()
    assert (forgetful_dir / "sync").read_bytes() == b"at once"
    assert (forgetful_dir / "dsync").read_bytes() == b"at once"


def test_many_files(forgetful_dir: ForgetfulDir) -> None:
    d = forgetful_dir / "batches"
    d.mkdir()
    fsync_dir(forgetful_dir.path)
    for i in range(300):
        write(d / f"{i:04d}.jsonl", b"line %d\n" % i * 10, sync=True)
        if i == 199:
            fsync_dir(d)
    forgetful_dir.power_loss()
    names = sorted(os.listdir(d))
    assert names == [f"{i:04d}.jsonl" for i in range(200)]
    assert all((d / n).read_bytes() == b"line %d\n" % int(n[:4]) * 10 for n in names)


@pytest.fixture(params=[False, True], ids=["page-cache", "direct-io"])
def either_mount(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ForgetfulDir]:
    fs = mount(tmp_path / "forgetful", direct_io=request.param)
    try:
        yield fs
    finally:
        fs.unmount()


def test_reads_after_a_loss_see_the_reverted_data(either_mount: ForgetfulDir) -> None:
    fs = either_mount
    path = durable_file(fs, "f", b"A" * 8192)
    with open(path, "r+b") as f:  # warm whatever the kernel caches, then change it all
        assert f.read() == b"A" * 8192
        f.seek(0)
        f.write(b"B" * 16384)
        f.flush()
        f.seek(0)
        assert f.read() == b"B" * 16384
    assert path.stat().st_size == 16384

    fs.power_loss()

    assert path.stat().st_size == 8192
    assert path.read_bytes() == b"A" * 8192
    with open(path, "rb") as f:
        if not fs.direct_io:  # libfuse 3.14 refuses shared mmap with direct_io
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                assert m[:] == b"A" * 8192


def test_an_unlinked_open_file_still_works(forgetful_dir: ForgetfulDir) -> None:
    """Through its descriptor: read, write, ftruncate and fsync (not fstat: libfuse's path API
    answers ESTALE for a file with no name left, see forgetfs.py)."""
    path = forgetful_dir / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        path.unlink()
        assert os.listdir(forgetful_dir) == []  # hard_remove: no .fuse_hidden* file
        os.write(fd, b"still here")
        os.ftruncate(fd, 5)
        os.fsync(fd)
        assert os.pread(fd, 100, 0) == b"still"
    finally:
        os.close(fd)
    forgetful_dir.power_loss()
    assert os.listdir(forgetful_dir) == []


def test_flock_works_on_the_mount(forgetful_dir: ForgetfulDir) -> None:
    """The engine and the supervisor hold run.lock with flock."""
    a = os.open(forgetful_dir / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    b = os.open(forgetful_dir / "run.lock", os.O_RDWR)
    fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(BlockingIOError):
        fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(a)
    fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(b)


WRITER = textwrap.dedent("""
    import os, sys
    folder = sys.argv[1]
    fd = os.open(os.path.join(folder, "synced.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    loose = open(os.path.join(folder, "loose.log"), "ab", buffering=0)
    n = 0
    while True:
        n += 1
        os.write(fd, b"line %d\\n" % n)
        os.fsync(fd)
        loose.write(b"line %d\\n" % n)
        print(n, flush=True)
""")


def test_a_real_program_killed_then_power_loss(forgetful_dir: ForgetfulDir) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(forgetful_dir.path)],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    said = [0]  # the numbers of the lines it said were fsynced

    def line_200() -> bool:
        said.append(int(proc.stdout.readline()))  # type: ignore[union-attr]
        return said[-1] >= 200

    wait_until(line_200, 60, "the writer's 200th fsynced line", proc=proc, interval=0)
    kill_pid(proc)
    said += [int(n) for n in proc.stdout.read().split()]
    acknowledged = said[-1]
    proc.stdout.close()
    assert (forgetful_dir / "loose.log").stat().st_size > 0

    forgetful_dir.power_loss()

    lines = (forgetful_dir / "synced.log").read_bytes().splitlines(keepends=True)
    # Every line it said was fsynced, maybe one more it fsynced before being killed.
    assert acknowledged <= len(lines) <= acknowledged + 1
    assert lines == [b"line %d\n" % n for n in range(1, len(lines) + 1)]
    assert sorted(os.listdir(forgetful_dir)) == ["synced.log"]  # loose.log's name never synced
