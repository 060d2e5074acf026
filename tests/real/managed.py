"""An agent-managed run whose server 0 is a real SGLang server and whose server 1 is
tests/real/forward.py in front of the tier's shared server, and what its tests read beside
the supervisor: the status over time, the processes in /proc, load sent straight to a server.
Used by tests/real/test_supervise_real.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.supervise.sglang_metrics import MetricsReading, parse_exposition, read_metrics
from tests.plugins.supervised import rpc_status
from tests.real.env import RealEnv
from tests.real.server import CPU_FLAGS
from tests.servers.ports import wait_until

FORWARD = Path(__file__).with_name("forward.py")


@dataclass
class Sample:
    t: float
    snap: dict[str, Any]

    def server(self, n: int = 0) -> dict[str, Any]:
        row: dict[str, Any] = self.snap["servers"][n]
        return row

    @property
    def live(self) -> bool:
        """The supervisor's word (not the run directory's while none runs)."""
        return bool(self.snap["source"] == "supervisor")


class Sampler:
    """The run's status every half second from `up` on, each kept with the time it was read."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                snap = rpc_status(self.run_dir)
            except (AssertionError, OSError, ValueError):
                continue  # between two supervisors
            if len(snap.get("servers") or []) == 2:
                self.samples.append(Sample(time.time(), snap))

    def since(self, t: float, until: float | None = None) -> list[Sample]:
        return [s for s in list(self.samples) if s.t >= t and (until is None or s.t <= until)]

    def first(self, since: float, cond: Callable[[Sample], bool], timeout: float,
              what: str) -> Sample:
        """The first live sample since `since` for which cond holds, waited for."""
        found: list[Sample] = []

        def check() -> bool:
            found[:] = [s for s in self.since(since) if s.live and cond(s)][:1]
            return bool(found)

        wait_until(check, timeout, what, interval=0.2)
        return found[0]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@dataclass
class Managed:
    root: Path
    env: RealEnv
    base_port: int
    health: dict[str, float]
    decode_log_interval: int
    prompts: int
    sampler: Sampler | None = None
    up_at: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def url(self) -> str:
        """Server 0, the real one."""
        return f"http://127.0.0.1:{self.base_port}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "logs" / "sglang_gpu0.log"

    @property
    def upstream_file(self) -> Path:
        """Where server 1 reads the shared server's address; it listens once this exists."""
        return self.root / "upstream"

    @property
    def samples(self) -> Sampler:
        assert self.sampler is not None
        return self.sampler

    def record(self, n: int = 0) -> dict[str, Any]:
        rec: dict[str, Any] = json.loads((self.run_dir / "servers.json").read_text())[n]
        return rec

    def status(self) -> dict[str, Any]:
        return rpc_status(self.run_dir)

    def wait(self, cond: Callable[[dict[str, Any]], bool], timeout: float,
             what: str) -> dict[str, Any]:
        """The supervisor's first snapshot (not the disk's) for which cond holds."""
        seen: dict[str, Any] = {}

        def check() -> bool:
            snap = self.status()
            if snap["source"] == "supervisor" and cond(snap):
                seen.update(snap)
                return True
            return False

        wait_until(check, timeout, what, interval=0.5)
        return seen

    def require(self, state: str = "healthy") -> None:
        """Fail at once, saying why, when an earlier test left server 0 otherwise."""
        snap = self.status()
        if snap["source"] != "supervisor" or snap["servers"][0]["state"] != state:
            pytest.fail(f"the managed server is not {state} (an earlier step failed): "
                        f"{snap['servers'][0]}", pytrace=False)

    def supervisor_log(self) -> str:
        return (self.run_dir / "logs" / "supervisor.log").read_text(errors="replace")

    def metrics_text(self) -> str:
        r = httpx.get(f"{self.url}/metrics", timeout=30)
        r.raise_for_status()
        return r.text

    def metrics(self) -> MetricsReading:
        return read_metrics(self.metrics_text())

    def counter(self, name: str) -> float:
        """One of the server's own counters (sglang:NAME summed over labels; 0 before any)."""
        return sum(s.value for s in parse_exposition(self.metrics_text()) if s.name == name)

    def active(self, endpoint: str) -> int:
        """Requests the server holds on an endpoint now (sglang:http_requests_active, kept
        live by its HTTP layer, unlike the scheduler's gauges, which move at log lines)."""
        return int(sum(s.value for s in parse_exposition(self.metrics_text())
                       if s.name == "http_requests_active"
                       and s.labels.get("endpoint") == endpoint))

    def wait_idle(self, timeout: float = 180) -> None:
        wait_until(lambda: (x := self.metrics()).running_reqs == 0 and x.queued_reqs == 0,
                   timeout, "server 0 idle, as it says itself")

    def write_spec(self) -> Path:
        """run.toml, prompts.jsonl and the launch picker. The command template is the real
        server's; the picker runs it for group [0] and the forwarder for group [1]."""
        pick = self.root / "pick.sh"
        pick.write_text(
            "#!/bin/sh\n"
            "# Server 0 (GPU group [0]) is the real SGLang server of the template; server 1\n"
            "# (group [1]) a forwarder to the tier's shared server. $1: the group's first GPU,\n"
            "# $2: its port; then the template's command.\n"
            'gpu=$1; port=$2; shift 2\n'
            '[ "$gpu" = 0 ] && exec "$@"\n'
            f'exec {sys.executable} {FORWARD} --port "$port" --upstream-file '
            f'{self.upstream_file}\n')
        real = [str(self.env.python), "-m", "sglang.launch_server", "--model-path", "{model}",
                "--port", "{port}", "--tp", "{tp}", "--host", "127.0.0.1", *CPU_FLAGS,
                "--max-total-tokens", "65536",
                "--decode-log-interval", str(self.decode_log_interval)]
        command = f"/bin/sh {pick} {{gpu}} {{port}} " + " ".join(real)
        env = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                        for k, v in self.env.server_env().items())
        with open(self.root / "prompts.jsonl", "w") as f:
            for i in range(self.prompts):
                f.write(json.dumps({"messages": [
                    {"role": "user", "content": f"Prompt {i}: count from {i} to {i + 9}."}]})
                    + "\n")
        lines = ["[run]", 'name = "real-supervised"', 'dir = "run"', "", "[servers]",
                 "gpus = [[0], [1]]", f"base_port = {self.base_port}",
                 f"model = {json.dumps(str(self.env.model))}",
                 f"command = {json.dumps(command)}", f"env = {{{env}}}"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.health.items()]
        lines += ["", "[generate]", 'prompts = "prompts.jsonl"', "max_tokens = 16",
                  "concurrency_per_server = 8", "batch_size = 20", "request_timeout_s = 120",
                  "min_deadline_s = 20", "connect_timeout_s = 5"]
        spec = self.root / "run.toml"
        spec.write_text("\n".join(lines) + "\n")
        return spec


# ----- processes ----------------------------------------------------------------------------

def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except FileNotFoundError:
        return ""


def proc_state(pid: int) -> str | None:
    """/proc/PID/stat's state letter (R, S, T stopped, Z zombie), None when gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None
    return data[data.rfind(b")") + 2:][:1].decode()


def sglang_processes(pids: list[int]) -> dict[str, int]:
    """SGLang's scheduler and detokenizer among pids, by the names they give themselves."""
    out = {}
    for pid in pids:
        cmd = cmdline(pid)
        for name in ("sglang::scheduler", "sglang::detokenizer"):
            if cmd.startswith(name):
                out[name] = pid
    return out


def listening(port: int) -> bool:
    """Whether any socket listens on the port (state 0A in /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
            return True
    return False


# ----- load ---------------------------------------------------------------------------------

def health(url: str, timeout: float = 60) -> tuple[str, float]:
    """GET /health as the server answers it ("200", "503", "refused", a timeout) and how long
    the answer took."""
    t = time.monotonic()
    try:
        code = str(httpx.get(f"{url}/health", timeout=timeout).status_code)
    except httpx.ConnectError:
        code = "refused"
    except httpx.HTTPError as exc:
        code = type(exc).__name__
    return code, time.monotonic() - t


class Load:
    """Requests straight to one server, from a thread of their own: `wave` sends n at once and
    no more; `closed` keeps n in flight until stop. Answers are counted by status."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _start(self, go: Callable[[], Coroutine[Any, Any, None]]) -> None:
        t = threading.Thread(target=lambda: asyncio.run(go()), daemon=True)
        t.start()
        self._threads.append(t)

    async def _one(self, client: httpx.AsyncClient, i: int, max_new_tokens: int) -> None:
        try:
            r = await client.post(f"{self.url}/generate", json={
                "text": f"Story {i}: once upon a time", "sampling_params": {
                    "max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}})
            key = str(r.status_code)
        except httpx.HTTPError as exc:
            key = type(exc).__name__
        self.answers[key] = self.answers.get(key, 0) + 1

    def wave(self, n: int, max_new_tokens: int) -> None:
        async def go() -> None:
            async with httpx.AsyncClient(timeout=900,
                                         limits=httpx.Limits(max_connections=n)) as c:
                await asyncio.gather(*(self._one(c, i, max_new_tokens) for i in range(n)))
        self._start(go)

    def closed(self, n: int, max_new_tokens: int) -> None:
        async def go() -> None:
            async with httpx.AsyncClient(timeout=900,
                                         limits=httpx.Limits(max_connections=n)) as c:
                async def worker(i: int) -> None:
                    while not self._stop.is_set():
                        await self._one(c, i, max_new_tokens)
                await asyncio.gather(*(worker(i) for i in range(n)))
        self._start(go)

    def stop(self) -> None:
        """Send no more and abort what runs (SGLang ends each at its next step)."""
        self._stop.set()
        httpx.post(f"{self.url}/abort_request", json={"abort_all": True}, timeout=120)
        for t in self._threads:
            t.join(timeout=180)
            assert not t.is_alive(), "requests still out 180 s after abort_all"


def spin(until: float) -> None:
    """A CPU hog (run it in a process of its own)."""
    while time.time() < until:
        pass
