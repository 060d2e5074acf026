"""Mount a forgetting filesystem for a test, cut its power, read its operation log.

    def test_x(forgetful_dir):
        run = forgetful_dir / "run"          # a Path inside the mount
        proc = start_the_writer(run)        # anything: the engine, a trainer, a script
        ...
        kill_pid(proc)                      # 1. kill -9 (and reap) every process writing there
        forgetful_dir.power_loss()          # 2. then cut the power: all that was not fsynced
                                            #    (data; and names: their directory's fsync)
                                            #    is gone; recovery then runs on what is left

The order matters: a power loss is refused while any file on the mount is open (a live
writer's next write would land after the cut). The FUSE server is a process of its own, so the
test may SIGKILL everything else. `oplog()` returns every change made so far, in order; see
crash.py to rebuild the disk as a power loss at any earlier point would have left it.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.powerloss import oplog
from tests.servers.ports import wait_until

REPO = Path(__file__).resolve().parents[2]


class PowerLossRefused(RuntimeError):
    """Files on the mount were still open: kill the processes using it first."""


class HarnessError(RuntimeError):
    """The forgetting filesystem itself failed (it could not mount, or hit an internal error)."""


def fuse_missing() -> str | None:
    """Why FUSE cannot be used on this machine, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return ("/dev/fuse is missing: the power-loss tests need FUSE; in a container give it "
                "the device (docker run --device /dev/fuse --cap-add SYS_ADMIN)")
    if shutil.which("fusermount3") is None or ctypes.util.find_library("fuse3") is None:
        return "libfuse3 or fusermount3 is missing: run 'make system-deps' (Debian: fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed: pip install -e '.[dev]'"
    return None


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(_unescape(line.split()[4]) == target for line in f)


class ForgetfulDir:
    """A forgetting filesystem mounted at `path`, served by process `proc`."""

    def __init__(self, path: Path, proc: subprocess.Popen[bytes], control: str,
                 server_log: Path, direct_io: bool) -> None:
        self.path = path
        self.direct_io = direct_io
        self.proc = proc
        self.control = control
        self.server_log = server_log

    def __truediv__(self, other: str) -> Path:
        return self.path / other

    def __fspath__(self) -> str:
        return str(self.path)

    def _ask(self, request: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect("\0" + self.control)
            with s.makefile("rwb") as f:
                f.write(json.dumps(request).encode() + b"\n")
                f.flush()
                line = f.readline()
        if not line:
            raise HarnessError(f"forgetfs at {self.path} closed its control socket: "
                               f"{self._log_tail()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _log_tail(self) -> str:
        try:
            return self.server_log.read_text()[-3000:] or "(its log is empty)"
        except OSError as exc:
            return f"(no log: {exc})"

    def power_loss(self, wait_s: float = 10.0) -> int:
        """Cut the power; returns k, the number of ops in the log before the cut (the cut is
        ops[k]): the live state now is the crash state of prefix k.

        Call it after every process writing here was SIGKILLed and reaped: files still open
        after `wait_s` (the kernel closes a dead process's files a moment after it is reaped)
        refuse the cut with PowerLossRefused, naming them."""
        reply = self._ask({"cmd": "power_loss", "wait_s": wait_s}, timeout=wait_s + 30)
        if not reply["ok"]:
            raise PowerLossRefused(f"{self.path}: {reply['error']}")
        return int(reply["ops"])

    def stats(self) -> dict[str, Any]:
        return self._ask({"cmd": "stats"})

    def oplog(self) -> list[oplog.Op]:
        """Every change the filesystem made since it was mounted, in order."""
        with tempfile.TemporaryDirectory(prefix="forgetfs-log-") as d:
            reply = self._ask({"cmd": "save_log", "folder": d})
            if not reply["ok"]:
                raise HarnessError(f"{self.path}: {reply['error']}")
            return oplog.load(Path(d))

    def unmount(self) -> None:
        """Unmount and stop the server, whatever state they are in (lazily when busy).
        Raises HarnessError afterwards if the filesystem hit an internal error."""
        errors = 0
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, HarnessError, ValueError):
                errors = int(self.stats()["internal_errors"])
        lazy = False
        for args in (["fusermount3", "-u"], ["fusermount3", "-uz"], ["umount", "-l"]):
            if not mounted(self.path):
                break
            lazy = args != ["fusermount3", "-u"]
            subprocess.run([*args, str(self.path)], capture_output=True, timeout=30)
        if lazy and self.proc.poll() is None:
            self.proc.terminate()  # detached but still in use: libfuse exits on SIGTERM
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if mounted(self.path):
            raise HarnessError(f"{self.path} is still mounted after fusermount3 -uz and "
                               "umount -l")
        if errors:
            raise HarnessError(f"forgetfs at {self.path} hit {errors} internal error(s): "
                               f"{self._log_tail()}")


def mount(root: Path, direct_io: bool = False, log: bool = True) -> ForgetfulDir:
    """Mount an empty forgetting filesystem at ROOT/mnt (its server's log: ROOT/forgetfs.log).
    With log=False no operation log is kept (a long run: the log holds every byte written)."""
    problem = fuse_missing()
    if problem:
        raise HarnessError(problem)
    path = root / "mnt"
    path.mkdir(parents=True)
    server_log = root / "forgetfs.log"
    control = f"forgetfs-{os.getpid()}-{secrets.token_hex(6)}"
    cmd = [sys.executable, "-m", "tests.powerloss.forgetfs", str(path), "--control", control]
    if direct_io:
        cmd.append("--direct-io")
    if not log:
        cmd.append("--no-log")
    with open(server_log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "FUSE_LIBRARY_NAME": "fuse3"})
    fs = ForgetfulDir(path, proc, control, server_log, direct_io)

    def ready() -> bool:
        if not mounted(path):
            return False
        with contextlib.suppress(OSError):
            return bool(fs._ask({"cmd": "ping"}, timeout=5)["ok"])
        return False

    try:
        wait_until(ready, 60, f"forgetfs mount at {path}", proc=proc)
    except (RuntimeError, TimeoutError) as exc:
        fs.unmount()
        raise HarnessError(f"{exc}: {fs._log_tail()}") from None
    return fs


@pytest.fixture
def forgetful_dir(tmp_path: Path) -> Iterator[ForgetfulDir]:
    """A forgetting filesystem, unmounted after the test whatever happened. A machine that
    cannot run FUSE fails the test (never a skip): power-loss safety is not optional."""
    problem = fuse_missing()
    if problem:
        pytest.fail(problem, pytrace=False)
    fs = mount(tmp_path / "forgetful")
    try:
        yield fs
    finally:
        fs.unmount()
