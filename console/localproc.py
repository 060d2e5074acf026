"""Local helper processes (test servers, the demo): free loopback ports, readiness by polling,
and a SIGKILL by pid (never by name)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable


def free_ports(n: int) -> list[int]:
    """Return n distinct free TCP ports on 127.0.0.1 (all sockets held until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_until(
    cond: Callable[[], bool],
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.05,
) -> None:
    """Poll cond until true; fail with `what` on timeout or when proc exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process {proc.pid} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:.0f} s")
        time.sleep(interval)


def kill_pid(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL our own process (by pid, never by name) and reap it."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)
