"""A killed pull leaves nothing running, and two pulls never share a destination (issue 11,
item 13), over the real sshd with OpenSSH's sftp.

Before: after `kill -9` of `fleetdeck pull`, its sftp and ssh children (a session of their
own, nothing tying them to the pull) kept writing the `.fdpart`, and a re-pull ran beside
them. Now the copiers die with the pull (PR_SET_PDEATHSIG), and a pull holds a lock on its
destination that a second one is refused by while the first lives."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pull.fakenode import FakeNode, entry, page, snapshot
from tests.servers.sshd import SshServer

ROOT = Path(__file__).resolve().parents[2]
SIZE = 256 * 2**20


def processes() -> dict[int, tuple[str, int, int]]:
    """Live processes (zombies left out): pid -> (comm, ppid, process group)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            state, ppid, pgrp = stat[stat.rfind(")") + 2:].split()[:3]
            if state != "Z":
                found[int(name)] = (stat[stat.index("(") + 1:stat.rfind(")")], int(ppid),
                                    int(pgrp))
    return found


def wait_for(cond, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def pull_args(node: FakeNode) -> list[str]:
    return [sys.executable, "-m", "console.cli", "--fleet", str(node.fleet), "pull", "gen-1"]


def pull_env(data_path: str) -> dict[str, str]:
    return {**os.environ, "FLEETDECK_PULL_DATA_PATH": data_path}


def pull(node: FakeNode, data_path: str) -> subprocess.Popen[str]:
    return subprocess.Popen(pull_args(node), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=pull_env(data_path))


def pull_to_end(node: FakeNode, data_path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(pull_args(node), cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env=pull_env(data_path))


def stopped_mid_file(node: FakeNode, data_path: str, copier: str, part: Path
                     ) -> tuple[subprocess.Popen[str], int]:
    """A pull started and its writer stopped (SIGSTOP) with the part half-copied: (the pull,
    its copier's pid). sftp writes the part itself; on the stream it is pull's own thread, so
    pull is stopped (its ssh then waits on a full pipe). Stopped first, then checked: a look
    before the stop could be followed by the rest of the copy (the 256 MiB go in about a
    second), so a pull seen whole once stopped is killed and started again."""
    for _ in range(3):
        stopped = _stop_mid_file(pull(node, data_path), data_path, copier, part)
        if stopped is not None:
            return stopped
        shutil.rmtree(node.pulls, ignore_errors=True)
    raise AssertionError("three pulls copied the whole file before they could be stopped")


def _stop_mid_file(first: subprocess.Popen[str], data_path: str, copier: str, part: Path
                   ) -> tuple[subprocess.Popen[str], int] | None:
    """The pull and its copier once stopped mid-file; None (the pull killed, its copier
    gone) when it was past the file already."""
    sftp = wait_for(lambda: [pid for pid, (comm, ppid, _) in processes().items()
                             if ppid == first.pid and comm == copier], 120, copier)[0]
    wait_for(lambda: first.poll() is not None or (part.exists() and part.stat().st_size > 0),
             120, "bytes in the part")
    writer = sftp if data_path == "openssh" else first.pid
    try:
        os.kill(writer, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    if first.poll() is None and part.exists() and 0 < part.stat().st_size < SIZE:
        return first, sftp
    for pid in {writer, first.pid}:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    first.kill()
    first.wait(timeout=60)
    wait_for(lambda: sftp not in processes(), 120, "the whole pull's copier to go")
    return None


# The copier pull starts, per data path: sftp (its ssh beneath it), or ssh carrying the
# agent's stream (pull's own thread writes the part).
COPIERS = {"openssh": "sftp", "stream": "ssh"}


@pytest.mark.parametrize("data_path", ["openssh", "stream"])
def test_a_killed_pull_leaves_no_copier_and_a_second_waits_its_turn(sshd: SshServer,
                                                                    tmp_path: Path,
                                                                    data_path: str) -> None:
    copier = COPIERS[data_path]
    if shutil.which(copier) is None:
        pytest.skip(f"OpenSSH's {copier} client is not installed")
    node = FakeNode(sshd, tmp_path, tmp_path / "pulls")
    with open(node.run_dir / "big.bin", "wb") as f:
        f.truncate(SIZE)  # zeros, sparse on the node
    sha = hashlib.sha256(bytes(SIZE)).hexdigest()
    node.answer({"status": snapshot(run="r"),
                 "manifest": page(entry("big.bin", size=SIZE, sha256=sha))})
    part = node.pulls / "gen-1" / "r" / "big.bin.fdpart"

    first, sftp = stopped_mid_file(node, data_path, copier, part)
    try:
        group = processes()[sftp][2]  # sftp's own process group, its ssh in it too
        assert any(comm == "ssh" for comm, _, pgrp in processes().values() if pgrp == group)

        # A second pull while the first lives: refused, naming the live one; nothing written.
        held = part.stat().st_size
        second = pull_to_end(node, data_path)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "another pull is writing" in second.stderr and f"pid {first.pid}" in \
            second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert part.stat().st_size == held

        first.kill()  # kill -9 of the pull
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    try:
        os.kill(sftp, signal.SIGCONT)  # an orphan would now write on
    except ProcessLookupError:
        pass
    wait_for(lambda: not any(pgrp == group for _, _, pgrp in processes().values()), 120,
             "the killed pull's sftp and ssh to be gone")
    assert part.stat().st_size == held, "something wrote the part after the pull died"

    # The next pull resumes from the part and finishes: the lock died with its holder (the
    # kernel drops a flock once the holder's files are closed; wait for that, not a while).
    lock = node.pulls / "gen-1" / "r" / ".fleetdeck" / "pull.lock"

    def lock_free() -> bool:
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    wait_for(lock_free, 120, "the killed pull's lock to be released")
    # The next pull resumes from the part and finishes. (It was once seen refused by the
    # lock: `pull(node).args` had started a hidden pull of its own, which won the race.)
    third = pull_to_end(node, data_path)
    assert third.returncode == 0, third.stderr
    report = json.loads(third.stdout)
    assert report["copied"] == 1 and report["resumed"]["big.bin"] > 0, report
    assert hashlib.sha256((node.pulls / "gen-1" / "r" / "big.bin").read_bytes()).hexdigest() \
        == sha
