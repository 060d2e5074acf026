"""The per-user socket folder in /tmp is checked before use, and stale sockets are removed."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.plugins.supervised import agent, wait_status


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # sun_path holds 107 bytes: a short folder of its own under /tmp.
    with tempfile.TemporaryDirectory(prefix="fd-sk-") as d:
        yield Path(d)


def _open_to_all(p: Path) -> None:
    p.mkdir()
    os.chmod(p, 0o777)


def _a_file(p: Path) -> None:
    p.write_text("planted\n")


def _a_symlink(p: Path) -> None:
    target = p.parent / "elsewhere"
    target.mkdir(mode=0o700)
    p.symlink_to(target)


def _someone_elses(p: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can make a folder that belongs to another user")
    p.mkdir(mode=0o700)
    os.chown(p, 65534, 65534)


@pytest.mark.parametrize(("plant", "says"), [
    (_open_to_all, "mode 0777"), (_a_file, "not a folder"), (_a_symlink, "symbolic link"),
    (_someone_elses, "belongs to uid 65534"),
], ids=["mode", "file", "symlink", "owner"])
def test_a_socket_folder_that_is_not_ours_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch, supervised, short_dir: Path,
        plant: Callable[[Path], None], says: str) -> None:
    folder = short_dir / "fleetdeck-0"
    plant(folder)
    monkeypatch.setenv("FLEETDECK_SOCKET_DIR", str(folder))
    run = supervised(1, prompts=20)
    r = agent("up", str(run.spec))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert str(folder) in r.stderr and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (run.run_dir / "supervisor.pid").exists()
    assert not run.run_dir.exists(), "nothing is written when the start is refused"


def test_stale_sockets_of_dead_supervisors_are_removed(monkeypatch: pytest.MonkeyPatch,
                                                       supervised, short_dir: Path) -> None:
    folder = short_dir / "s"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("FLEETDECK_SOCKET_DIR", str(folder))
    stale = folder / "0123456789abcdef.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(stale))
    dead.close()  # the file stays: a supervisor killed with -9 leaves it so
    live_path = folder / "fedcba9876543210.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(live_path))
    live.listen()
    try:
        run = supervised(1, prompts=20)
        r = agent("up", str(run.spec))
        assert r.returncode == 0, r.stderr
        wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "done")
        assert not stale.exists(), "the stale socket is still there"
        assert live_path.exists(), "a live socket was removed"
        mine = Path((run.run_dir / "agent.sock.path").read_text().strip())
        assert mine.parent == folder and mine.exists()
        assert "a socket of a supervisor that is gone" in \
            (run.run_dir / "logs" / "supervisor.log").read_text()
        assert agent("down", str(run.run_dir), "--yes").returncode == 0
    finally:
        live.close()
