"""SGLang simulators as real subprocesses for tests: `start_sim(tmp_path, *args)` starts
`python -m agents.sim` on a free loopback port, waits until it is ready and returns a handle.

    sim = start_sim(tmp_path, *FAST_ARGS, "--enable-metrics")
    try:
        httpx.get(f"{sim.url}/server_info")
    finally:
        sim.kill()
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.servers.ports import dies_with_tests, free_ports, kill_pid, wait_until

ROOT = Path(__file__).resolve().parents[1]
# Fast and ready at once: 1 simulated second = 1 ms; decode log line every 20 ms.
FAST_ARGS = ("--time-scale", "0.001", "--load-seconds", "0", "--decode-log-interval-s", "20")


@dataclass
class SimHandle:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path  # stdout: SGLang-format lines only
    port: int = 0
    err_path: Path | None = field(default=None)  # stderr (uvicorn warnings, tracebacks)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[str]:
        return self.log_text().splitlines()

    def wait_log(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """Poll the log until a line matches `pattern` (a regex); return the match."""
        rx = re.compile(pattern)
        found: list[re.Match[str]] = []

        def seen() -> bool:
            for line in self.log_lines():
                m = rx.search(line)
                if m:
                    found.append(m)
                    return True
            return False

        wait_until(seen, timeout, f"simulator log line /{pattern}/")
        return found[0]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL by pid and reap."""
        kill_pid(self.proc)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def start_sim(tmp_path: Path, *args: str, name: str = "sim", wait_ready: bool = True,
              timeout: float = 120.0, port: int | None = None) -> SimHandle:
    """Start a simulator with `args` (CLI flags; see FAST_ARGS) on 127.0.0.1.

    stdout goes to tmp_path/<name>-<port>.log, stderr to .err. With wait_ready, returns once
    /ready answers 200 (polled), failing early if the process exits."""
    port = port or free_ports(1)[0]
    log_path = tmp_path / f"{name}-{port}.log"
    err_path = tmp_path / f"{name}-{port}.err"
    cmd = [sys.executable, "-m", "agents.sim", "--host", "127.0.0.1", "--port", str(port),
           *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, env=env,
                                start_new_session=True, preexec_fn=dies_with_tests())
    handle = SimHandle(f"http://127.0.0.1:{port}", proc, log_path, port, err_path)
    if wait_ready:
        try:
            wait_until(lambda: _ready(handle.url), timeout, f"simulator on port {port}", proc,
                       interval=0.02)
        except (TimeoutError, RuntimeError) as exc:
            handle.kill()
            raise RuntimeError(f"{exc}\nstderr:\n{err_path.read_text(errors='replace')}"
                               ) from None
    return handle


def wait_exit(handle: SimHandle, timeout: float = 60.0) -> int:
    """Wait for the simulator process to end by itself; return its exit code."""
    return handle.proc.wait(timeout=timeout)
