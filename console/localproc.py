"""Local helper processes (test servers, the demo, pull's sftp copiers): free loopback ports,
readiness by polling, a SIGKILL by pid (never by name), and children that die with the
process that started them."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` for a child that must not outlive us (an sftp copier, a local S3
    server): Linux sends it `sig` when the thread that started it dies, kill -9 included
    (PR_SET_PDEATHSIG). Start such children from the main thread (the event loop's): the
    signal follows the starting thread. If we died between fork and here, the child ends at
    once. None where there is no prctl (macOS): the caller's own cleanup is all there is."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing to look up after fork
    prctl = libc.prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), sig)

    return preexec


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000  # below this: well-known and registered services
_random = random.SystemRandom()
# A port drawn here is claimed for CLAIM_S by a file of that name, which every other draw on
# the machine skips: a server binds its port only seconds (SeaweedFS's several) to minutes
# (SGLang, after loading) after the draw, and a test run beside another, or four workers,
# drew the same free port in that window (ci: SeaweedFS exited 1 at start).
CLAIMS = Path(tempfile.gettempdir()) / f"fleetdeck-port-claims-{os.getuid()}"
CLAIM_S = 900.0


def _claim(port: int) -> bool:
    """Claim `port` for CLAIM_S; False when another draw claimed it less than CLAIM_S ago."""
    CLAIMS.mkdir(mode=0o700, exist_ok=True)
    path = CLAIMS / str(port)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        pass
    try:
        if time.time() - path.stat().st_mtime < CLAIM_S:
            return False
        os.utime(path)  # an old claim: its server is long up, or gone
        return True
    except OSError:
        return False


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def port_block(n: int) -> int:
    """A base port with n consecutive free ports after it (servers take base_port + i), below
    the kernel's ephemeral range as free_ports' are."""
    top = _ephemeral_start()
    low = LOWEST_PORT if top - LOWEST_PORT > 50 * n else 1024
    for _ in range(500):
        base = _random.randint(low, max(low, top - n))
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            if all(_claim(base + i) for i in range(n)):
                return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free ports below {top}")


def free_ports(n: int) -> list[int]:
    """Return n distinct free TCP ports on 127.0.0.1 (all sockets held until all are chosen),
    drawn at random below the kernel's ephemeral range. A port the kernel hands out for
    port 0 is an ephemeral one, which any outgoing connection on the machine may take next:
    a server that binds late (SGLang binds only after loading its weights, as the simulator
    does) found its port taken by another test's client (ci3: "address already in use")."""
    start = _ephemeral_start()
    pool = range(LOWEST_PORT, start) if start - LOWEST_PORT >= 50 * n else None
    socks: list[socket.socket] = []
    try:
        tries = 0
        while len(socks) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            port = _random.choice(pool) if pool is not None and tries < 1000 + 50 * n else 0
            tries += 1
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            if port and not _claim(port):
                s.close()
                continue
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
