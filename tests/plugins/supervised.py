"""`supervised`: runs under the real supervisor with simulated GPU servers, and the helpers that
drive `fleetdeck-agent` for them (agent, rpc_status, wait_status, port_block)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.cli.inspect import status_bytes
from agents.supervise.procinfo import alive
from console.localproc import port_block
from tests.engine.runs import write_prompts
from tests.servers.ports import wait_until


def agent(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def rpc_status(run_dir: Path) -> dict[str, Any]:
    """What `fleetdeck-agent status RUN_DIR --json` prints, asked in this process (the same
    code, over the supervisor's real socket): a new interpreter per poll cost 0.7 s of CPU,
    a whole core while a test waited, taken from the run it watched."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raw = status_bytes(run_dir.resolve())
        assert raw is not None, f"{run_dir}: not a run directory"
        return json.loads(raw)
    r = agent("status", str(run_dir), "--json")  # inside an event loop: a process of its own
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_status(run_dir: Path, cond: Callable[[dict[str, Any]], bool], timeout: float,
                what: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    last: list[dict[str, Any]] = []

    def check() -> bool:
        snap = rpc_status(run_dir)
        last[:] = [snap]
        if cond(snap):
            seen.update(snap)
            return True
        return False

    try:
        wait_until(check, timeout, what, interval=0.2)
    except TimeoutError as exc:  # what the run said last, and its logs' ends: a CI failure
        raise TimeoutError(f"{exc}\n{_last_words(run_dir, last[0] if last else None)}") from None
    return seen


def _last_words(run_dir: Path, snap: dict[str, Any] | None) -> str:
    """The status last read and the tail of each log under the run dir's logs/."""
    out = [f"last status: {json.dumps(snap, default=str)[:3000]}"]
    for log in sorted((run_dir / "logs").glob("*.log")):
        try:
            tail = log.read_bytes()[-4000:].decode("utf-8", "replace")
        except OSError as exc:
            tail = f"({exc})"
        out.append(f"--- {log.name} (tail) ---\n{tail}")
    return "\n".join(out)


def wait_progressing(cond: Callable[[], bool], progress: Callable[[], object], stall_s: float,
                     what: str, cap_s: float = 3600.0, interval: float = 0.5) -> None:
    """Poll cond until true, for as long as the work moves: fail when `progress()` (a count of
    lines done, say) has not changed for stall_s, or past cap_s in all. A run's length on a
    real CPU server scales with the box's load (a CPU hog beside it doubled it); a stall does
    not, so that is what a test waiting for a run's end judges."""
    start = moved = time.monotonic()
    last = progress()
    while not cond():
        now = time.monotonic()
        seen = progress()
        if seen != last:
            last, moved = seen, now
        if now - moved > stall_s:
            raise TimeoutError(f"{what}: no progress for {stall_s:.0f} s (stuck at {last!r})")
        if now - start > cap_s:
            raise TimeoutError(f"{what}: not ready after {cap_s:.0f} s, still moving")
        time.sleep(interval)


def wait_run(run_dir: Path, cond: Callable[[dict[str, Any]], bool], stall_s: float,
             what: str) -> dict[str, Any]:
    """wait_status for a condition that comes with the run's progress: judged by a stall of
    its lines done and failed, not by the clock (wait_progressing)."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        snap = rpc_status(run_dir)
        seen.clear()
        seen.update(snap)
        return bool(cond(snap))

    def moved() -> object:
        p = seen.get("progress") or {}
        return (p.get("completed"), p.get("failed"))

    wait_progressing(check, moved, stall_s, what)
    return seen


def kill_run(run_dir: Path) -> None:
    """SIGKILL what a run left behind: its supervisor and its servers' process groups."""
    pids = []
    try:
        pids.append(int((run_dir / "supervisor.pid").read_text().split()[0]))
    except (FileNotFoundError, ValueError, IndexError):
        pass
    try:
        pids += [s["pid"] for s in json.loads((run_dir / "servers.json").read_text())
                 if s.get("pid")]
    except FileNotFoundError:
        pass
    for pid in pids:
        if alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class Run:
    def __init__(self, root: Path, spec: Path) -> None:
        self.root = root
        self.spec = spec
        self.run_dir = root / "run"

    def servers(self) -> list[dict[str, Any]]:
        return json.loads((self.run_dir / "servers.json").read_text())

    def supervisor_pid(self) -> int:
        return int((self.run_dir / "supervisor.pid").read_text())


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def make(n_servers: int = 2, prompts: int = 500, sim_args: str = "", root: Path | None = None,
             alerts: dict[str, Any] | None = None, gpus: list[Any] | None = None,
             command: str | None = None, servers: dict[str, Any] | None = None,
             **generate: Any) -> Run:
        """`gpus`: [servers] gpus as given (groups: [[0, 1], [2, 3]]), one server per entry;
        without it, n_servers servers on GPUs 0..n-1. `command`: a [servers] command template
        in place of the simulator's; `servers`: [servers] keys over the defaults here."""
        root = root or tmp_path
        root.mkdir(parents=True, exist_ok=True)
        write_prompts(root / "prompts.jsonl", prompts)
        gpus = gpus if gpus is not None else list(range(n_servers))
        n_servers = len(gpus)
        base = port_block(n_servers)
        command = command or (
            f"{sys.executable} -m agents.sim --port {{port}} --model-path {{model}} "
            f"--time-scale 0.05 --load-seconds 0.5 --enable-metrics "
            f"--decode-log-interval-s 20 {sim_args}")
        gen = {"prompts": "prompts.jsonl", "max_tokens": 256, "concurrency_per_server": 8,
               "batch_size": 100, "request_timeout_s": 30.0, "connect_timeout_s": 2.0}
        gen.update(generate)
        sv: dict[str, Any] = {"startup_timeout_s": 60, "restart_backoff_s": 0.3,
                              "health_interval_s": 0.3, "health_timeout_s": 30,
                              **(servers or {})}
        lines = ["[run]", 'name = "agent-test"', 'dir = "run"', "", "[servers]",
                 f"gpus = {json.dumps(gpus)}", f"base_port = {base}",
                 'model = "qwen-sim"', f"command = {json.dumps(command)}"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in sv.items()] + ["", "[generate]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in gen.items()]
        if alerts:
            lines += ["", "[alerts]"] + [f"{k} = {json.dumps(v)}" for k, v in alerts.items()]
        spec = root / "run.toml"
        spec.write_text("\n".join(lines) + "\n")
        run = Run(root, spec)
        runs.append(run)
        return run

    yield make
    for run in runs:
        if (run.run_dir / "supervisor.pid").exists():
            agent("down", str(run.run_dir), "--yes")
        kill_run(run.run_dir)
