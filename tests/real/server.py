"""A real SGLang 0.5.23 server on the CPU, started by the tier: the flags that work here, its
readiness, its own counters (`/metrics`), and a kill that leaves none of its processes.

    server = start_server(env, tmp_path / "default", max_total_tokens=65536)
    server.wait_ready()
    before = server.metrics()
    ...                                   # one test on the server at a time
    delta = server.metrics().delta(before, "generation_tokens_total")
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.real.env import RealEnv
from tests.servers.ports import dies_with_tests, free_ports

# The flags that serve on this CPU (no AMX, no CUDA): torch-native attention and sampling,
# no graphs, float32 (bf16 is much slower on AVX2), metrics on, no warm-up request.
CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native",
             "--sampling-backend", "pytorch", "--disable-cuda-graph", "--skip-server-warmup",
             "--enable-metrics", "--dtype", "float32")
# An idle 0.5.23 scheduler polls its sockets without pause: about a quarter of a core each,
# measured here, taken from whatever test runs beside it. SGLang's own remedy sleeps until
# a request arrives.
IDLE_FLAGS = ("--sleep-on-idle",)
# A start-up here is 50-160 s, most of it imports; ten minutes is a box far busier than that.
READY_TIMEOUT_S = 600.0


def launch_command(env: RealEnv, port: int, *extra: str) -> list[str]:
    return [str(env.python), "-m", "sglang.launch_server", "--model-path", str(env.model),
            "--host", "127.0.0.1", "--port", str(port), *CPU_FLAGS, *IDLE_FLAGS, *extra]


@dataclass
class Metrics:
    """One `/metrics` reading: every `sglang:` sample summed over its labels (one rank here)."""

    values: dict[str, float]
    text: str = field(repr=False, default="")

    def __getitem__(self, name: str) -> float:
        return self.values.get(name, 0.0)

    def delta(self, before: Metrics, name: str) -> float:
        return self[name] - before[name]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("sglang:"):
                    key = sample.name.removeprefix("sglang:")
                    values[key] = values.get(key, 0.0) + sample.value
        return cls(values, text)


@dataclass
class RealServer:
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def health(self, timeout: float = 5.0) -> int | None:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout).status_code
        except httpx.HTTPError:
            return None

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Seconds from launch until /health answered 200. Fails early, with the log's tail,
        when the process exits."""
        if self.ready_after_s is not None:
            return self.ready_after_s
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"SGLang on port {self.port} exited "
                                     f"{self.proc.returncode} before ready:\n{self.log_tail()}")
            if self.health() == 200:
                self.ready_after_s = time.monotonic() - self.started
                return self.ready_after_s
            time.sleep(0.5)
        raise AssertionError(f"SGLang on port {self.port} not ready after {timeout:.0f} s:\n"
                             f"{self.log_tail()}")

    def metrics(self) -> Metrics:
        r = httpx.get(f"{self.url}/metrics", timeout=10.0)
        r.raise_for_status()
        return Metrics.parse(r.text)

    def server_info(self) -> dict[str, object]:
        r = httpx.get(f"{self.url}/server_info", timeout=10.0)
        r.raise_for_status()
        body: dict[str, object] = r.json()
        return body

    def wait_idle(self, timeout: float = 60.0) -> Metrics:
        """Until the server itself says nothing runs or waits (after aborts, between tests)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m["num_running_reqs"] == 0 and m["num_queue_reqs"] == 0:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"SGLang on port {self.port} still busy after {timeout} s: "
                                     f"running {m['num_running_reqs']}, "
                                     f"queued {m['num_queue_reqs']}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the whole session (launcher, scheduler, detokenizer) and reap."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def start_server(env: RealEnv, folder: Path, *extra: str, port: int | None = None,
                 max_total_tokens: int = 65536) -> RealServer:
    """Launch (not wait for) a server in a session of its own; output to folder/sglang.log.

    `--max-total-tokens` is always given: left to itself SGLang sizes its KV pool from free
    memory (16M tokens, 15 GB and 30 s of allocation on this box)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_ports(1)[0]
    log_path = folder / "sglang.log"
    cmd = launch_command(env, port, "--max-total-tokens", str(max_total_tokens), *extra)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=dies_with_tests(),
                                env={**os.environ, **env.server_env()}, cwd=folder)
    return RealServer(port, proc, log_path, time.monotonic())
