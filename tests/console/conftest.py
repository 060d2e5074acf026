"""Fixtures for the TUI tests: a live supervised generation run on simulated GPUs (shared by a
module's action checks), its one-node fleet, and a wait-on-condition helper for Pilot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agents.supervise.procinfo import alive
from console.fleet import ConsoleSettings, Fleet, Node
from tests.engine.runs import write_prompts
from tests.plugins.supervised import port_block
from tests.servers.ports import wait_until

ScreenT = TypeVar("ScreenT")


async def until(pilot: Any, cond: Callable[[], Any], timeout: float = 60.0,
                what: str = "condition") -> Any:
    """Let the app run until cond() is truthy (polling); fail naming `what` after timeout.
    A wait that passes costs nothing, so timeouts are sized for a loaded machine: at least
    60 s for the TUI alone, 120 s where a real agent, engine or sshd must answer too."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.05)


def on_screen(app: Any, kind: type[ScreenT]) -> ScreenT | None:
    """The app's screen once it is a mounted `kind` (composed: its widgets are there), else
    None. A pushed screen is on top before its widgets exist."""
    screen = app.screen
    return screen if isinstance(screen, kind) and screen.is_mounted else None


async def palette_search(pilot: Any, query: str, min_hits: int = 1,
                         on_open: Callable[[Any], None] | None = None) -> Any:
    """Open the command palette, type `query` and return the palette (still open) once the
    search for the whole query has ended with at least `min_hits` hits. Each key starts a
    search whose hits stream in (every 0.25 s): a list read at its first hit can still lack
    one that is coming (and a check that a title is absent would pass on it), and a search
    for a prefix ('paus') can be the one shown. `on_open` runs before the first key."""
    from textual.command import CommandList, CommandPalette

    await pilot.press("ctrl+p")
    palette = await until(pilot, lambda: on_screen(pilot.app, CommandPalette), 120,
                          "the palette")
    if on_open is not None:
        on_open(palette)
    searches: list[tuple[str, Any]] = []  # each key's search: (the query, its worker)
    gather = palette._gather_commands

    def gather_seen(value: str) -> Any:
        searches.append((value, gather(value)))
        return searches[-1][1]

    palette._gather_commands = gather_seen
    await pilot.press(*query)
    results = palette.query_one(CommandList)
    await until(pilot, lambda: bool(searches) and searches[-1][0] == query
                and searches[-1][1].is_finished and results.option_count >= min_hits, 120,
                f"the palette's search for {query!r} ended")
    await pilot.pause()
    return palette


def agent(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@dataclass
class LiveRun:
    root: Path
    spec: Path
    run_dir: Path

    def fleet(self, **console: Any) -> Fleet:
        node = Node(name="sim-1", run_dir=str(self.run_dir), local=True,
                    agent=f"{sys.executable} -m agents.cli")
        return Fleet(nodes=[node], console=ConsoleSettings(**console), source="test-fleet")

    def pids(self) -> list[int]:
        pids = []
        try:
            pids.append(int((self.run_dir / "supervisor.pid").read_text().split()[0]))
        except (FileNotFoundError, ValueError, IndexError):
            pass
        try:
            servers = json.loads((self.run_dir / "servers.json").read_text())
            pids += [s["pid"] for s in servers if s.get("pid")]
        except (FileNotFoundError, ValueError):
            pass
        return pids


def start_run(root: Path, prompts: int = 4000, servers: int = 2) -> LiveRun:
    root.mkdir(parents=True, exist_ok=True)
    write_prompts(root / "prompts.jsonl", prompts)
    base = port_block(servers)
    command = (f"{sys.executable} -m agents.sim --port {{port}} --model-path {{model}} "
               f"--time-scale 0.2 --load-seconds 0.3 --enable-metrics")
    lines = ["[run]", 'name = "tui-test"', 'dir = "run"', "", "[servers]",
             f"gpus = {list(range(servers))}", f"base_port = {base}", 'model = "qwen-sim"',
             f"command = {json.dumps(command)}", "startup_timeout_s = 60",
             "restart_backoff_s = 0.3", "health_interval_s = 0.3", "health_timeout_s = 30",
             "", "[generate]", 'prompts = "prompts.jsonl"', "max_tokens = 256",
             "concurrency_per_server = 4", "batch_size = 100", "request_timeout_s = 30.0",
             "connect_timeout_s = 2.0"]
    spec = root / "run.toml"
    spec.write_text("\n".join(lines) + "\n")
    r = agent("up", str(spec), timeout=180)
    assert r.returncode == 0, r.stderr
    return LiveRun(root, spec, root / "run")


def stop_run(run: LiveRun) -> None:
    if (run.run_dir / "supervisor.pid").exists():
        agent("down", str(run.run_dir), "--yes")
    for pid in run.pids():
        if alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    # Enough prompts that the run is still live at the module's last test however slow a
    # loaded machine makes the ones before it (4,000 finished mid-module under load).
    run = start_run(tmp_path_factory.mktemp("tui-run"), prompts=40_000)
    try:
        wait_until(lambda: (run.run_dir / "progress.json").exists(), 120, "the engine started")
        yield run
    finally:
        stop_run(run)
