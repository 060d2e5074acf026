"""Concurrency that finds the knee: per server, a controller that measures output tokens/s and
latency at a level, steps up while throughput rises by more than a threshold, steps back when
it stops rising (past the peak only latency grows), settles, and probes again now and then and
after a server restart. It works from what it measures; the one figure it takes from a server
is the ceiling the server reports (`max_running_requests`), which it never exceeds. Its
changes go through control.json like anyone's (rev + 1, audited with who = auto)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from agents.engine.dispatch import Server
from agents.rundir.control import set_auto_level
from agents.rundir.schema import AutoTune, Control, TunePhase, TunePoint

log = logging.getLogger("fleetdeck.autotune")

TICK_S = 0.5


@dataclass(frozen=True, slots=True)
class TuneSettings:
    factor: float = 1.5  # a step multiplies (or divides) the level by this
    gain: float = 0.03  # a step up must raise tokens/s by more than this share to be kept
    # A measurement: at least min_requests answers of requests that ran wholly at the level,
    # until the speed's relative standard error is under `precision` (or max_requests, or
    # max_window_s, whichever comes first).
    min_requests: int = 16
    max_requests: int = 600
    precision: float = 0.01
    max_window_s: float = 900.0
    # A measurement counts only when the server was kept this full (the end of a run, a pause
    # or a retry storm leave it short of its level: that says nothing about the server).
    full_share: float = 0.85
    reprobe_s: float = 1800.0  # a settled server is probed again this often
    apply_timeout_s: float = 10.0  # a level the engine did not take by then is taken as is


@dataclass(slots=True)
class _Window:
    """Answers of requests that started after the level took effect, and the in-flight
    integral over the same time."""

    level: int
    since: float
    tokens: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    busy: float = 0.0  # integral of requests in flight, request-seconds
    last: float = 0.0

    def add(self, tokens: int, latency: float) -> None:
        self.tokens.append(tokens)
        self.latencies.append(latency)

    def speed(self) -> tuple[float, float]:
        """Per-request decode speed (tokens / latency, summed: long answers weigh more) and
        its relative standard error (delta method)."""
        n = len(self.tokens)
        lat = sum(self.latencies)
        if n == 0 or lat <= 0:
            return 0.0, math.inf
        r = sum(self.tokens) / lat
        if n < 2 or r <= 0:
            return r, math.inf
        resid = sum((t - r * x) ** 2 for t, x in zip(self.tokens, self.latencies, strict=True))
        se = math.sqrt(resid / (n - 1) / n) / (lat / n)
        return r, se / r


@dataclass(slots=True)
class Measured:
    level: int
    tok_per_s: float
    latency_s: float
    requests: int
    at: float


class KneeFinder:
    """One server's controller. Feed it answers (`answer`) and call `tick` with what the
    server does now; `tick` returns a new level to ask for, or None. Pure: no I/O, any clock.

    The search: measure the level it starts at, step up (x factor) while tokens/s rises by
    more than `gain`; the first step that does not is undone and the search settles. When the
    very first step up gains nothing, it steps down instead while tokens/s holds within `gain`
    of the best. Settled, it keeps measuring its level (the curve stays current) and searches
    again every `reprobe_s` and after the server restarts."""

    def __init__(self, level: int, cap: int, now: float,
                 settings: TuneSettings | None = None) -> None:
        self.s = settings or TuneSettings()
        self.cap = max(1, cap)
        self.level = max(1, min(level, self.cap))
        self.phase: TunePhase = "measuring"
        self.curve: dict[int, Measured] = {}
        self.steps = 0  # measurements that made a decision (each is a step of the search)
        self.note: str | None = None
        self.next_probe_at: float | None = None
        self._then: TunePhase = "measuring"  # the phase after "waiting"
        self._asked_at = now
        self._window: _Window | None = _Window(self.level, now, last=now)
        self._healthy = True
        self._search(None)

    # -- the search -----------------------------------------------------------------------------

    def _search(self, base: Measured | None) -> None:
        self._base: Measured | None = base
        self._best = base.tok_per_s if base is not None else 0.0
        self._direction: Literal["up", "down"] = "up"
        self._climbed = False

    def _up(self, level: int) -> int:
        return min(self.cap, max(level + 1, math.ceil(level * self.s.factor)))

    def _down(self, level: int) -> int:
        return max(1, min(level - 1, math.floor(level / self.s.factor)))

    def _ask(self, level: int, now: float, then: TunePhase) -> int | None:
        """Go to `level` (None: already there), then measure it in phase `then`."""
        self._then = then
        if level == self.level:
            self.phase = then
            self._window = _Window(level, now, last=now)
            return None
        self.level = level
        self.phase = "waiting"
        self._asked_at = now
        self._window = None
        return level

    def _settle(self, level: int, now: float, why: str) -> int | None:
        self.note = why
        self.next_probe_at = now + self.s.reprobe_s
        return self._ask(level, now, "settled")

    def _next(self, level: int, direction: Literal["up", "down"], now: float,
              note: str | None = None) -> int | None:
        self._direction = direction
        nxt = self._up(level) if direction == "up" else self._down(level)
        if nxt == level:
            edge = f"the server's ceiling {self.cap}" if direction == "up" else "1"
            return self._settle(level, now, (note + "; " if note else "") +
                                f"settled at {level} ({edge})")
        self.note = note or f"{direction} to {nxt}"
        return self._ask(nxt, now, "measuring")

    def _decide(self, m: Measured, now: float) -> int | None:
        """A measurement is in: keep climbing, turn down, or settle."""
        base = self._base
        if base is None:
            self._base, self._best = m, m.tok_per_s
            return self._next(m.level, "up", now)
        gain = m.tok_per_s / base.tok_per_s - 1 if base.tok_per_s > 0 else math.inf
        lat = m.latency_s / base.latency_s - 1 if base.latency_s > 0 else 0.0
        change = f"{base.level} -> {m.level}: {gain:+.1%} tok/s, latency {lat:+.0%}"
        if self._direction == "up":
            if gain > self.s.gain:
                self._base, self._climbed = m, True
                self._best = max(self._best, m.tok_per_s)
                return self._next(m.level, "up", now)
            if not self._climbed:
                # The first step up gained nothing: the knee may lie below where we started.
                return self._next(base.level, "down", now,
                                  f"{change}; trying below {base.level}")
            return self._settle(base.level, now, f"{change}: back to {base.level}")
        # Going down: a lower level that keeps (almost) the best throughput is better (less
        # latency, less KV pressure); the loss allowed is bounded by `gain` in all.
        if m.tok_per_s >= self._best * (1 - self.s.gain):
            self._base = m
            return self._next(m.level, "down", now)
        return self._settle(base.level, now, f"{change}: back to {base.level}")

    # -- the outside world ----------------------------------------------------------------------

    def set_cap(self, cap: int, now: float) -> int | None:
        """The server's reported ceiling changed (or became known)."""
        cap = max(1, cap)
        if cap == self.cap:
            return None
        self.cap = cap
        if self.level <= cap:
            return None
        self.curve = {k: v for k, v in self.curve.items() if k <= cap}
        self._search(None)
        self.note = f"the server runs at most {cap}: down to {cap}"
        return self._ask(cap, now, "measuring")

    def restart(self, now: float) -> None:
        """The server came back after being down: measure again from where it is."""
        self.curve.clear()
        self._search(None)
        self.note = "the server restarted: probing again"
        self.level = min(self.level, self.cap)
        self._ask(self.level, now, "measuring")

    def answer(self, started: float, tokens: int, latency_s: float) -> None:
        """One answer from the server: `started` is when its request was sent."""
        w = self._window
        if w is not None and started >= w.since:
            w.add(tokens, latency_s)

    def tick(self, now: float, in_flight: int, limit: int, healthy: bool) -> int | None:
        if not healthy:
            self._healthy = False
            self._window = None
            return None
        if not self._healthy:
            self._healthy = True
            self.restart(now)
            return None
        if self.phase == "waiting":
            if limit == self.level or now - self._asked_at >= self.s.apply_timeout_s:
                if limit != self.level:
                    self.note = f"asked for {self.level}, the engine runs {limit}"
                    self.level = max(1, min(limit, self.cap))
                self.phase = self._then
                self._window = _Window(self.level, now, last=now)
            return None
        if limit != self.level:
            # The engine runs another level than this one: the tuner just took over (from a
            # level above the ceiling, say). Ask again; after apply_timeout_s take what runs.
            self._then, self.phase, self._asked_at = self.phase, "waiting", now
            return self.level
        w = self._window
        if w is None or (in_flight > self.level and not w.tokens):
            # After a step down the requests sent before it drain first: the server runs
            # above the level until they do, so the window opens once they have.
            w = self._window = _Window(self.level, now, last=now)
        w.busy += min(in_flight, self.level) * max(0.0, now - w.last)
        w.last = now
        return self._maybe_measured(w, now)

    def _maybe_measured(self, w: _Window, now: float) -> int | None:
        n = len(w.tokens)
        elapsed = now - w.since
        speed, rel_se = w.speed()
        enough = n >= self.s.max_requests or (n >= self.s.min_requests
                                               and rel_se <= self.s.precision)
        if not enough and not (elapsed >= self.s.max_window_s and n >= 3):
            return None
        self._window = _Window(w.level, now, last=now)
        fill = w.busy / elapsed if elapsed > 0 else 0.0
        if fill < self.s.full_share * w.level:
            return None  # not kept full (the end of the run, a pause): no verdict, again
        m = Measured(w.level, fill * speed, sum(w.latencies) / n, n, now)
        self.curve[w.level] = m
        if self.phase == "settled":
            if self.next_probe_at is not None and now >= self.next_probe_at:
                self._search(m)
                return self._next(m.level, "up", now, "probing again")
            return None
        self.steps += 1
        return self._decide(m, now)

    def state(self, wall_offset: float = 0.0) -> AutoTune:
        """What progress.json shows; times moved onto the wall clock by `wall_offset`."""
        best = max(self.curve.values(), key=lambda m: m.tok_per_s, default=None)
        return AutoTune(
            level=self.level, phase=self.phase, cap=self.cap,
            best=best.level if best is not None else None,
            curve=[TunePoint(m.level, round(m.tok_per_s, 1), round(m.latency_s, 3),
                             m.requests, round(m.at + wall_offset, 3))
                   for m in sorted(self.curve.values(), key=lambda m: m.level)],
            next_probe_at=(round(self.next_probe_at + wall_offset, 3)
                           if self.phase == "settled" and self.next_probe_at is not None
                           else None),
            note=self.note,
        )


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


async def fetch_cap(client: httpx.AsyncClient) -> int | None:
    for path in ("/server_info", "/get_server_info"):
        try:
            r = await client.get(path, timeout=10.0)
        except httpx.HTTPError:
            return None
        if r.status_code == 200:
            try:
                return reported_cap(r.json())
            except ValueError:
                return None
    return None


# -- in the engine ---------------------------------------------------------------------------


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
        self.settings = settings or TuneSettings()
        self.finders: dict[int, KneeFinder] = {}
        self._caps: dict[int, int | None] = {}
        self._seen: dict[int, float] = {}
        self._was_healthy: dict[int, bool] = {}
        self._cap_tasks: set[asyncio.Task[None]] = set()

    def state(self, number: int) -> AutoTune | None:
        f = self.finders.get(number)
        return f.state(time.time() - time.monotonic()) if f is not None else None

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


__all__ = ["AutoTuner", "KneeFinder", "TuneSettings", "fetch_cap", "reported_cap"]
