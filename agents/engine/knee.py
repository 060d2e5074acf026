"""The knee of one server, found from measurements: a pure controller (no I/O, any clock) that
measures output tokens/s and latency at a level, steps up while throughput rises by more than
a threshold, steps back when it stops rising, settles, and probes again now and then and
after a server restart; every verdict checked against what the server says of itself (its
retractions, its queue and its own tokens/s: agents/engine/serverload.py). Run in the engine
by agents/engine/autotune.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal

from agents.engine.serverload import ServerLoad
from agents.rundir.schema import AutoTune, TunePhase, TunePoint


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
    # The server's queue "grew" by at least this many requests (and this share of the level)
    # between two levels, or over one window, for the queue rule to hold.
    queue_growth: float = 1.0
    queue_growth_share: float = 0.1
    min_load_samples: int = 6  # server readings a window needs before its queue trend counts

    @classmethod
    def from_text(cls, text: str, where: str) -> TuneSettings:
        """`min_requests=8,max_window_s=30` (FLEETDECK_AUTOTUNE: tests and benchmarks that
        cannot wait for a GPU-sized measurement); an unknown key or a bad value is an
        error naming it."""
        out: dict[str, float | int] = {}
        known = {f.name: f.type for f in fields(cls)}
        for item in filter(None, (x.strip() for x in text.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ValueError(f"{where}: {item!r}: expected KEY=VALUE with KEY one of "
                                 f"{', '.join(known)}")
            try:
                out[key] = int(raw) if known[key] in (int, "int") else float(raw)
            except ValueError:
                raise ValueError(f"{where}: {key}: not a number: {raw!r}") from None
        return cls(**out)  # type: ignore[arg-type]


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
    loads: list[ServerLoad] = field(default_factory=list)  # the server's readings since

    def add(self, tokens: int, latency: float) -> None:
        self.tokens.append(tokens)
        self.latencies.append(latency)

    def retracted(self) -> int:
        """Requests the server retracted since the window's first reading of it."""
        return self.loads[-1].retracted - self.loads[0].retracted if self.loads else 0

    def mean(self, what: str, part: slice = slice(None)) -> float | None:
        """The mean of a server figure (`queued`, `gen_throughput`) over the readings (a
        part of them), None when the server gives none."""
        values = [v for v in (getattr(x, what) for x in self.loads[part]) if v is not None]
        return sum(values) / len(values) if values else None

    def trend(self, what: str) -> tuple[float, float] | None:
        """A figure's mean over the first third of the readings and over the last third."""
        third = len(self.loads) // 3
        if third == 0:
            return None
        first, last = self.mean(what, slice(0, third)), self.mean(what, slice(-third, None))
        return (first, last) if first is not None and last is not None else None

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
    # What the server said over the window: its mean queue and its own tokens/s (None: it
    # did not say).
    queue: float | None = None
    server_tok_s: float | None = None


class KneeFinder:
    """One server's controller. Feed it answers (`answer`) and call `tick` with what the
    server does now; `tick` returns a new level to ask for, or None. Pure: no I/O, any clock.

    The search: measure the level it starts at, step up (x factor) while tokens/s rises by
    more than `gain`; the first step that does not is undone and the search settles. When the
    very first step up gains nothing, it steps down instead while tokens/s holds within `gain`
    of the best. Settled, it keeps measuring its level (the curve stays current) and searches
    again every `reprobe_s` and after the server restarts.

    The server's word (`observe`) overrules the measure: a retraction while at a level backs
    off at once (to the last calm level below, or down until calm) and caps every later
    level at that calm one (`kv_ceiling`) until the server restarts; a step up after which
    the server's queue grew while its own tokens/s stayed within `gain` is undone; a window
    whose queue kept growing while the server's tokens/s did not backs off as a retraction
    does (without the cap: nothing was done twice)."""

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
        # The last calm level below one where the server retracted: the tuner stays at or
        # under it until the server restarts (None: no retraction seen).
        self.kv_ceiling: int | None = None
        self._search(None)

    # -- the search -----------------------------------------------------------------------------

    def _search(self, base: Measured | None) -> None:
        self._base: Measured | None = base
        self._best = base.tok_per_s if base is not None else 0.0
        self._direction: Literal["up", "down"] = "up"
        self._climbed = False
        self._backing_off = False  # going down from pressure: the first calm level settles

    def _ceiling(self) -> int:
        return min(self.cap, self.kv_ceiling) if self.kv_ceiling is not None else self.cap

    def _up(self, level: int) -> int:
        return min(self._ceiling(), max(level + 1, math.ceil(level * self.s.factor)))

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
        if nxt <= level and direction == "up":
            if self.kv_ceiling is not None and self.kv_ceiling < self.cap:
                edge = f"the server retracted above {self.kv_ceiling}"
            else:
                edge = f"the server's ceiling {self.cap}"
            return self._settle(min(level, self._ceiling()), now,
                                (note + "; " if note else "") + f"settled at "
                                f"{min(level, self._ceiling())} ({edge})")
        if nxt == level:
            return self._settle(level, now, (note + "; " if note else "") +
                                f"settled at {level} (1)")
        self.note = note or f"{direction} to {nxt}"
        return self._ask(nxt, now, "measuring")

    def _decide(self, m: Measured, now: float) -> int | None:
        """A measurement is in: keep climbing, turn down, or settle."""
        if self._backing_off:
            # Down from a level where the server retracted or only queued: this one is calm.
            return self._settle(m.level, now, f"{self.note}; calm at {m.level}: settled")
        base = self._base
        if base is None:
            self._base, self._best = m, m.tok_per_s
            return self._next(m.level, "up", now)
        gain = m.tok_per_s / base.tok_per_s - 1 if base.tok_per_s > 0 else math.inf
        lat = m.latency_s / base.latency_s - 1 if base.latency_s > 0 else 0.0
        change = f"{base.level} -> {m.level}: {gain:+.1%} tok/s, latency {lat:+.0%}"
        if self._direction == "up":
            queued = self._only_queued(base, m)
            if queued is not None:
                # The engine's measure may read a gain (noise, a burst), but the server says
                # the extra requests only wait in its queue: that level is past the knee.
                return self._settle(base.level, now, f"{change}, but {queued}: back to "
                                    f"{base.level}")
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

    # -- what the server says of itself ---------------------------------------------------------

    def _grew(self, before: float, after: float, level: int) -> bool:
        return after - before >= max(self.s.queue_growth, self.s.queue_growth_share * level)

    def _only_queued(self, base: Measured, m: Measured) -> str | None:
        """Why the step from `base` up to `m` only filled the server's queue (its queue grew
        while its own tokens/s stayed within `gain`), or None."""
        if m.level <= base.level or None in (m.queue, base.queue, m.server_tok_s,
                                             base.server_tok_s):
            return None
        assert m.queue is not None and base.queue is not None
        assert m.server_tok_s is not None and base.server_tok_s is not None
        if not self._grew(base.queue, m.queue, m.level):
            return None
        if m.server_tok_s > base.server_tok_s * (1 + self.s.gain):
            return None
        return (f"the server's queue grew {base.queue:.1f} -> {m.queue:.1f} while its own "
                f"tokens/s stayed at {base.server_tok_s:.0f} -> {m.server_tok_s:.0f}")

    def _pressure(self, w: _Window) -> str | None:
        """Why the window's level is past the knee by what the server says: it retracted
        requests, or its queue kept growing while its tokens/s did not; None when calm."""
        n = w.retracted()
        if n > 0:
            return f"the server retracted {n} request{'s' if n != 1 else ''} at {w.level} " \
                   "(its KV cache is full)"
        if len(w.loads) < self.s.min_load_samples:
            return None
        queue, thr = w.trend("queued"), w.trend("gen_throughput")
        if queue is None or thr is None or not self._grew(queue[0], queue[1], w.level):
            return None
        if thr[1] > thr[0] * (1 + self.s.gain):
            return None
        return (f"the server's queue grew {queue[0]:.1f} -> {queue[1]:.1f} at {w.level} while "
                f"its tokens/s stayed at {thr[0]:.0f} -> {thr[1]:.0f}")

    def _back_off(self, w: _Window, why: str, now: float) -> int | None:
        """The level is past the knee: back to the last calm level below it, or down."""
        base = self._base
        calm = base is not None and base.level < w.level
        if w.retracted() > 0:
            # Levels between the last calm one and this were never measured: any of them may
            # retract too, so the ceiling is the calm one (or the one it backs off to).
            below = base.level if base is not None and calm else self._down(w.level)
            self.kv_ceiling = max(1, min(self.kv_ceiling or w.level, below))
        if self.phase == "measuring" and self._direction == "up" and base is not None and calm:
            return self._settle(base.level, now, f"{why}: back to {base.level}")
        lower = self._down(w.level)
        if lower == w.level:
            return self._settle(w.level, now, f"{why}; settled at {w.level} (1)")
        self._search(None)
        self._direction, self._backing_off = "down", True
        self.note = f"{why}: down to {lower}"
        return self._ask(lower, now, "measuring")

    def observe(self, now: float, load: ServerLoad) -> None:
        """One reading of the server's own figures (SGLang's, from the supervisor)."""
        w = self._window
        if w is not None and now >= w.since:
            w.loads.append(load)

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
        self.kv_ceiling = None  # it may have come back with another KV pool
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
        if w.retracted() > 0:
            # At once, not at the end of the measurement: every retraction is work the
            # server does again.
            why = self._pressure(w)
            assert why is not None
            self._window = _Window(w.level, now, last=now)
            return self._back_off(w, why, now)
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
        m = Measured(w.level, fill * speed, sum(w.latencies) / n, n, now,
                     w.mean("queued"), w.mean("gen_throughput"))
        pressure = self._pressure(w)
        if pressure is not None:
            self.steps += 1
            return self._back_off(w, pressure, now)
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


__all__ = ["KneeFinder", "Measured", "TuneSettings"]
