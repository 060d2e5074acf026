"""Crash states from the operation log equal what a live power loss leaves, on random
workloads; and "record once, cut at every point" on the product's atomic_write."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from agents.rundir.atomic import atomic_write
from tests.powerloss.crash import crash_state, crash_states, replay
from tests.powerloss.harness import ForgetfulDir
from tests.powerloss.tree import Tree, read_tree


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Workload:
    """Random file-system changes through real system calls on a live mount."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)

    def names(self) -> tuple[list[Path], list[Path]]:
        files, dirs = [], [self.root]
        for here, subdirs, filenames in os.walk(self.root):
            dirs += [Path(here, d) for d in subdirs]
            files += [Path(here, f) for f in filenames]
        return files, dirs

    def data(self) -> bytes:
        return self.rng.randbytes(self.rng.choice([1, 7, 100, 5000]))

    def step(self) -> None:
        rng = self.rng
        files, dirs = self.names()
        d = rng.choice(dirs)
        new = d / f"{rng.choice('abcdefgh')}{rng.randrange(3)}"
        f = rng.choice(files) if files else new
        kind = rng.choice(["create", "create", "append", "append", "pwrite", "truncate",
                           "fsync", "fsync", "fsyncdir", "fsyncdir", "rename", "unlink",
                           "mkdir", "rmdir", "link", "replace_dir"])
        try:
            if kind == "create":
                flags = os.O_WRONLY | os.O_CREAT | rng.choice([0, os.O_TRUNC, os.O_EXCL])
                fd = os.open(new, flags, 0o644)
                os.write(fd, self.data())
                if rng.random() < 0.5:
                    os.fsync(fd)
                os.close(fd)
            elif kind == "append":
                fd = os.open(f, os.O_WRONLY | os.O_APPEND)
                os.write(fd, self.data())
                if rng.random() < 0.5:
                    os.fdatasync(fd)
                os.close(fd)
            elif kind == "pwrite":
                fd = os.open(f, os.O_WRONLY)
                os.pwrite(fd, self.data(), rng.randrange(6000))
                os.close(fd)
            elif kind == "truncate":
                os.truncate(f, rng.randrange(6000))
            elif kind == "fsync":
                fsync_path(f)
            elif kind == "fsyncdir":
                fsync_path(d)
            elif kind == "rename":
                os.rename(f, new)
            elif kind == "unlink":
                os.unlink(f)
            elif kind == "mkdir":
                os.mkdir(new)
            elif kind == "rmdir":
                os.rmdir(rng.choice(dirs[1:]) if len(dirs) > 1 else new)
            elif kind == "link":
                os.link(f, new)
            elif kind == "replace_dir":
                os.rename(rng.choice(dirs[1:]) if len(dirs) > 1 else new, new)
        except OSError as exc:
            # Refused calls are part of the workload (they must change and log nothing).
            assert exc.errno in (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR,
                                 errno.ENOTDIR, errno.EINVAL), exc


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_crash_states_equal_live_power_losses(forgetful_dir: ForgetfulDir, tmp_path: Path,
                                              seed: int) -> None:
    work = Workload(forgetful_dir.path, seed)
    live: dict[int, Tree] = {}
    for _ in range(8):
        for _ in range(40):
            work.step()
        # The log holds every change the kernel made: replayed, it gives what processes see.
        log = forgetful_dir.oplog()
        seen = tmp_path / f"seen-{len(log)}"
        replay(log).materialize(seen, durable=False)
        assert read_tree(forgetful_dir.path).diff(read_tree(seen)) == []
        k = forgetful_dir.power_loss()
        live[k] = read_tree(forgetful_dir.path)

    # One replay of the whole log, cut at every moment the live power went.
    log = forgetful_dir.oplog()
    assert [op.kind for op in log].count("power_loss") == len(live)
    compared = 0
    for state in crash_states(log, live, tmp_path / "crash"):
        assert live[state.k].diff(read_tree(state.path)) == [], f"crash state at {state.k}"
        compared += 1
    assert compared == len(live)
    # The workload did what it is for: names and data both lost and kept.
    kinds = {op.kind for op in log}
    assert {"create", "write", "fsync", "fsyncdir", "rename", "unlink", "mkdir"} <= kinds
    assert any(t.files for t in live.values())


def test_record_once_cut_everywhere_atomic_write(forgetful_dir: ForgetfulDir,
                                                 tmp_path: Path) -> None:
    """atomic_write(durable=True) at every one of its ops: the file is always one whole
    version, never older than the last call that returned."""
    path = forgetful_dir / "status.json"
    returned_at = {}  # version -> ops in the log when its atomic_write returned
    for v in range(1, 21):
        atomic_write(path, b'{"version": %d, "pad": "%s"}' % (v, b"x" * v * 50), durable=True)
        returned_at[v] = int(forgetful_dir.stats()["ops"])
    log = forgetful_dir.oplog()

    for state in crash_states(log, range(len(log) + 1), tmp_path / "crash"):
        names = os.listdir(state.path)
        survivor = state.path / "status.json"
        done = [v for v, at in returned_at.items() if at <= state.k]
        if not done and not survivor.exists():
            continue  # before the first call returned the file may not exist yet
        assert survivor.exists(), f"crash at {state.k}: status.json is missing ({names})"
        text = survivor.read_bytes()
        v = int(text.split(b",")[0].split(b":")[1])
        assert text == b'{"version": %d, "pad": "%s"}' % (v, b"x" * v * 50), state.k
        assert v >= max(done, default=0), f"crash at {state.k}: version {v} after {done}"


def test_crash_state_points_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"0\.\.0"):
        crash_state([], 1, tmp_path)
    assert os.listdir(crash_state([], 0, tmp_path)) == []
