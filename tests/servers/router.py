"""SGLang's router (`sglang-router`, a pinned dev dependency) as a real process in front of
simulators, for tests and benchmarks: `start_router(root, worker_urls)` returns once the
router lists every worker healthy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.servers.ports import dies_with_tests, free_ports, kill_pid, wait_until


class Router:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def workers(self) -> list[dict[str, Any]]:
        workers: list[dict[str, Any]] = httpx.get(f"{self.url}/workers", timeout=60).json()[
            "workers"]
        return workers

    def kill(self) -> None:
        kill_pid(self.proc)


def start_router(root: Path, worker_urls: list[str], *args: str,
                 health_interval_s: float = 1) -> Router:
    """The router on a free loopback port (its log in root/router-<port>.log), `args` added
    to its command line."""
    # Its Prometheus port defaults to 29000, which any other router on the machine holds.
    port, prom = free_ports(2)
    log = root / f"router-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
             *worker_urls, "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-port", str(prom), "--health-check-interval-secs",
             f"{health_interval_s:g}", "--log-level", "warn", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=dies_with_tests(),
            env=dict(os.environ, NO_COLOR="1"))
    r = Router(proc, f"http://127.0.0.1:{port}", log)

    def all_listed() -> bool:
        try:
            listed = r.workers()
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return len(listed) == len(worker_urls) and all(w["is_healthy"] for w in listed)

    try:
        wait_until(all_listed, 120, f"the router on {port} listing {len(worker_urls)} workers",
                   proc, interval=0.1)
    except BaseException:
        r.kill()
        raise
    return r


def point_at_router(spec: Path, *extra: str) -> Path:
    """A spec written by tests.engine.runs.write_spec, its one URL made a router
    (`[servers] router = true`), with `extra` lines added to [servers]."""
    lines = "".join(f"{line}\n" for line in ("router = true", *extra))
    spec.write_text(spec.read_text().replace("[servers]\n", f"[servers]\n{lines}", 1))
    return spec
