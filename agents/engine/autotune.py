"""Auto-tuned concurrency in the engine: a KneeFinder (agents/engine/knee.py) per server that
control.json hands to the tuner, fed the server's answers and its own figures (SGLang's, from
the supervisor: agents/engine/serverload.py), capped by the ceiling the server reports
(`max_running_requests`, read here from /server_info). Its changes go through control.json
like anyone's (rev + 1, audited with who = auto).

A level where the server retracts requests (its KV pool is full: they go back to its queue
and start again) is past the knee whatever the throughput says: the tuner backs off at once,
and climbs no higher than the last calm level until the server restarts. A step up after which
the server's queue grows while its own tokens/s stays flat only queues requests there: it is
undone, and a level whose queue keeps growing while the server's tokens/s does not is backed
off from."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agents.engine.client import ServerClient, get_json
from agents.engine.dispatch import Server
from agents.engine.knee import KneeFinder, TuneSettings
from agents.engine.serverload import ServerLoad
from agents.rundir.control import set_auto_level
from agents.rundir.schema import AutoTune, Control

log = logging.getLogger("fleetdeck.autotune")

TICK_S = 0.5


# -- what a server reports about its ceiling -------------------------------------------------


def reported_cap(info: Any) -> int | None:
    """max running requests from /server_info: the effective figure of each DP rank summed
    (SGLang lowers the configured one for spec decoding), else the server argument."""
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states")
    if isinstance(states, list):
        per_rank = [s.get("effective_max_running_requests_per_dp") for s in states
                    if isinstance(s, dict)]
        if per_rank and all(isinstance(v, int) and v > 0 for v in per_rank):
            return sum(per_rank)  # type: ignore[arg-type]
        for s in states:
            v = s.get("max_running_requests") if isinstance(s, dict) else None
            if isinstance(v, int) and v > 0:
                return v
    v = info.get("max_running_requests")
    return v if isinstance(v, int) and v > 0 else None


async def fetch_cap(client: ServerClient) -> int | None:
    for path in ("/server_info", "/get_server_info"):
        info = await get_json(client, path, 10.0)
        if info is not None:
            try:
                return reported_cap(info)
            except ValueError:
                return None
    return None


# -- in the engine ---------------------------------------------------------------------------

SETTINGS_ENV = "FLEETDECK_AUTOTUNE"


def settings_from_env() -> TuneSettings:
    """TuneSettings with what FLEETDECK_AUTOTUNE sets (`key=value,...`), else the defaults."""
    text = os.environ.get(SETTINGS_ENV, "")
    return TuneSettings.from_text(text, SETTINGS_ENV) if text.strip() else TuneSettings()



class AutoTuner:
    """Runs a KneeFinder for every server that control.json hands to the tuner, in the
    engine's loop, and writes their levels back through control.json."""

    def __init__(self, run_dir: Path, servers: Iterable[Server],
                 control: Callable[[], Control | None], max_level: int,
                 settings: TuneSettings | None = None) -> None:
        self.run_dir = run_dir
        self.servers = list(servers)
        self.control = control
        self.max_level = max_level
        self.settings = settings or settings_from_env()
        self.finders: dict[int, KneeFinder] = {}
        self._caps: dict[int, int | None] = {}
        self._seen: dict[int, float] = {}
        self._was_healthy: dict[int, bool] = {}
        self._cap_tasks: set[asyncio.Task[None]] = set()

    def state(self, number: int) -> AutoTune | None:
        f = self.finders.get(number)
        return f.state(time.time() - time.monotonic()) if f is not None else None

    def observe(self, number: int, load: ServerLoad) -> None:
        """The server's own figures, each time the supervisor reads them."""
        f = self.finders.get(number)
        if f is not None:
            f.observe(time.monotonic(), load)

    async def run(self) -> None:
        while True:
            await self.step(time.monotonic())
            await asyncio.sleep(TICK_S)

    def _cap(self, number: int) -> int:
        cap = self._caps.get(number)
        return min(cap, self.max_level) if cap is not None else self.max_level

    def _refresh_cap(self, s: Server) -> None:
        async def fetch() -> None:
            cap = await fetch_cap(s.client)
            self._caps[s.number] = cap
            f = self.finders.get(s.number)
            if f is not None and cap is not None:
                want = f.set_cap(self._cap(s.number), time.monotonic())
                if want is not None:
                    await self._write(s.number, want, f.note or "")

        task = asyncio.get_running_loop().create_task(fetch())
        self._cap_tasks.add(task)
        task.add_done_callback(self._cap_tasks.discard)

    async def step(self, now: float) -> None:
        control = self.control()
        for s in self.servers:
            n = s.number
            if control is None or not control.concurrency.auto_for(n):
                if self.finders.pop(n, None) is not None:
                    log.info("server %d: auto-tuning off (set by hand)", n)
                continue
            healthy = s.state == "healthy"
            f = self.finders.get(n)
            if f is None:
                self._refresh_cap(s)
                f = self.finders[n] = KneeFinder(s.limit or 1, self._cap(n), now,
                                                 self.settings)
                self._seen[n] = now
                log.info("server %d: auto-tuning from %d (ceiling %d)", n, f.level, f.cap)
            elif healthy and not self._was_healthy.get(n, True):
                self._refresh_cap(s)  # a restarted server may have come back with new flags
            self._was_healthy[n] = healthy
            seen = self._seen.get(n, now)
            for finished, tokens, latency in s.answers:
                if finished > seen:
                    f.answer(finished - latency, tokens, latency)
            if s.answers:
                self._seen[n] = max(seen, s.answers[-1][0])
            want = f.tick(now, s.in_flight, s.limit, healthy)
            if want is not None:
                await self._write(n, want, f.note or "")

    async def _write(self, number: int, level: int, why: str) -> None:
        log.info("server %d: concurrency %d (%s)", number, level, why)
        await asyncio.to_thread(set_auto_level, self.run_dir, number, level, why)

    def close(self) -> None:
        for t in self._cap_tasks:
            t.cancel()


__all__ = ["AutoTuner", "KneeFinder", "TuneSettings", "fetch_cap", "reported_cap",
           "settings_from_env"]
