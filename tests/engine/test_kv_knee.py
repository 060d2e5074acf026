"""KV pressure in the engine's two rules: the auto-tuner never climbs into a level where the
server retracts or only queues (whatever its own throughput measure says), and a request's
deadline allows for the server's queue and its retractions, so a server short of KV room is
not hammered with aborts and resends. The server here is a closed-loop model in simulated
time whose KV pool holds `fits` requests (the rest wait in its queue, and with `retracts` it
sends running ones back there); the live counterpart is tests/real/test_kv_pressure.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from agents.engine.autotune import KneeFinder, TuneSettings
from agents.engine.deadlines import Pace
from agents.engine.serverload import ServerLoad

TOKENS = 100  # every answer's length
DT = 0.25  # simulated seconds per step
SETTINGS = TuneSettings(min_requests=12, precision=0.03, max_window_s=120.0, reprobe_s=300.0)


@dataclass
class _Req:
    started: float
    done: float = 0.0  # tokens made


@dataclass
class KvServer:
    """`level` requests kept in flight by a client. The first `fits` of them (in arrival order)
    run, each at `pace` tokens/s: the server's own tokens/s grows with the level up to `fits`
    and is flat past it, where the rest wait in its queue. With `retracts`, while more want
    to run than fit, it sends its newest running request back to the queue every
    `retract_every` s, to start again. `engine_bias`: past `fits`, what the engine measures
    reads this much faster than it is (noise, a burst of short answers): the server's own
    figures are what tell the truth."""

    fits: int
    pace: float = 20.0
    retracts: bool = False
    retract_every: float = 2.0
    engine_bias: float = 1.0
    now: float = 0.0
    level: int = 4
    retracted: int = 0
    reqs: list[_Req] = field(default_factory=list)
    _since_retract: float = 0.0

    def _fill(self) -> None:
        while len(self.reqs) < self.level:  # the client sends one as soon as one answers
            self.reqs.append(_Req(self.now))

    def step(self) -> list[tuple[float, int, float]]:
        self._fill()
        self.now += DT
        answers = []
        for r in self.reqs[:self.fits]:
            r.done += self.pace * DT
        for r in [r for r in self.reqs[:self.fits] if r.done >= TOKENS]:
            self.reqs.remove(r)
            latency = self.now - r.started
            if self.level > self.fits:
                latency /= self.engine_bias
            answers.append((self.now - latency, TOKENS, latency))
        self._since_retract += DT
        if self.retracts and len(self.reqs) > self.fits and \
                self._since_retract >= self.retract_every:
            self._since_retract = 0.0
            victim = self.reqs.pop(self.fits - 1)
            victim.done = 0.0  # it starts over behind the queue
            self.reqs.append(victim)
            self.retracted += 1
        self._fill()
        return answers

    def load(self) -> ServerLoad:
        running = min(len(self.reqs), self.fits)
        return ServerLoad(running=running, queued=len(self.reqs) - running,
                          gen_throughput=running * self.pace, token_usage=None,
                          retracted=self.retracted)


@dataclass
class Trace:
    levels: list[tuple[float, int]] = field(default_factory=list)  # (time, level asked)
    retracted_at: list[tuple[float, int]] = field(default_factory=list)  # (time, level)


def drive(server: KvServer, finder: KneeFinder, seconds: float,
          trace: Trace | None = None) -> Trace:
    """The engine's side: answers to the finder, the server's figures once a second (the
    supervisor's refresh), the finder's level applied at once."""
    trace = trace or Trace([(server.now, finder.level)])
    end = server.now + seconds
    next_load = server.now
    while server.now < end:
        before = server.retracted
        for started, tokens, latency in server.step():
            finder.answer(started, tokens, latency)
        if server.retracted > before:
            trace.retracted_at.append((server.now, server.level))
        if server.now >= next_load:
            finder.observe(server.now, server.load())
            next_load += 1.0
        want = finder.tick(server.now, len(server.reqs), server.level, True)
        if want is not None:
            server.level = want
            trace.levels.append((server.now, want))
    return trace


def test_auto_never_climbs_into_a_level_where_the_server_retracts() -> None:
    """The engine's measure reads +20% at every step past the pool (engine_bias): without
    the server's own word it would climb to the ceiling, retracting all the way."""
    server = KvServer(fits=12, retracts=True, engine_bias=1.2)
    finder = KneeFinder(4, 64, server.now, SETTINGS)
    trace = drive(server, finder, 2000.0)  # several re-probes (every 300 s)
    assert trace.retracted_at, f"the model never retracted: levels {trace.levels}"
    first_t, first_level = trace.retracted_at[0]
    assert finder.kv_ceiling is not None and finder.kv_ceiling < first_level
    later = [level for t, level in trace.levels if t > first_t]
    assert later and max(later) <= finder.kv_ceiling, (
        f"climbed to {max(later)} after retracting at {first_level}: {trace.levels}")
    assert finder.phase == "settled" and finder.level <= 12, (finder.level, finder.note)
    # Calm from then on, re-probes included: the only retractions are the first level's,
    # and those of its requests still out while the lower level took over.
    assert all(t < first_t + 30 for t, _ in trace.retracted_at), trace.retracted_at
    assert "retracted" in (finder.note or ""), finder.note


def test_a_step_up_that_only_fills_the_servers_queue_is_undone() -> None:
    server = KvServer(fits=12, engine_bias=1.3)
    finder = KneeFinder(4, 64, server.now, SETTINGS)
    trace = drive(server, finder, 900.0)
    assert finder.phase == "settled", (trace.levels, finder.note)
    asked = [level for _, level in trace.levels]
    # The first step past the pool whose only effect was the queue was taken back.
    assert max(asked) <= 1.5 * 1.5 * 12, asked
    assert finder.level <= 1.5 * 12, (finder.level, finder.note, asked)
    assert "queue grew" in (finder.note or ""), finder.note
    # Where it settled, the server's own tokens/s is its best: nothing was given up.
    assert min(finder.level, server.fits) * server.pace == server.fits * server.pace


def test_without_kv_pressure_the_search_is_the_throughput_one() -> None:
    """A pool that holds every level up to the ceiling: the server's figures change nothing."""
    server = KvServer(fits=1000)
    finder = KneeFinder(4, 48, server.now, SETTINGS)
    drive(server, finder, 900.0)
    assert finder.kv_ceiling is None
    assert finder.level == 48 and finder.phase == "settled", finder.note


def test_a_server_that_starts_retracting_at_its_settled_level_is_backed_off() -> None:
    server = KvServer(fits=1000)
    finder = KneeFinder(12, 12, server.now, SETTINGS)  # its ceiling: settles at 12
    drive(server, finder, 200.0)
    assert finder.phase == "settled" and finder.level == 12
    server.fits, server.retracts = 6, True  # longer prompts now: the pool holds fewer
    trace = drive(server, finder, 400.0)
    assert finder.level <= 6 and finder.phase == "settled", (trace.levels, finder.note)
    assert finder.kv_ceiling is not None and finder.kv_ceiling < 12
    # Once calm, the last retraction is well behind it.
    assert not trace.retracted_at or trace.retracted_at[-1][0] < server.now - 120
    finder.restart(server.now)  # a restarted server may have another pool
    assert finder.kv_ceiling is None


def test_the_queue_rule_needs_the_servers_word() -> None:
    """A server that gives no figures (no supervisor: `fleetdeck-agent generate`) is tuned
    from what the engine measures, as before."""
    server = KvServer(fits=12)
    finder = KneeFinder(4, 64, server.now, SETTINGS)
    trace = Trace([(0.0, 4)])
    end = 900.0
    while server.now < end:
        for started, tokens, latency in server.step():
            finder.answer(started, tokens, latency)
        want = finder.tick(server.now, len(server.reqs), server.level, True)
        if want is not None:
            server.level = want
            trace.levels.append((server.now, want))
    assert finder.phase == "settled" and finder.kv_ceiling is None
    assert finder.level <= 1.5 * 12, trace.levels  # flat past the pool: the gain rule stops


# -- deadlines -------------------------------------------------------------------------------

def _pace() -> Pace:
    pace = Pace(factor=3.0, min_s=1.0, max_s=3600.0)
    for _ in range(8):
        pace.observe(0, 100, 10.0)  # 10 tokens/s a request: 100 tokens in 10 s
    return pace


def test_a_server_that_says_nothing_keeps_the_plain_deadline() -> None:
    d = _pace().deadline(0, 100)
    assert d is not None and d.seconds == pytest.approx(30.0) and d.waits == 0


def test_the_deadline_allows_for_the_servers_queue() -> None:
    pace = _pace()
    pace.observe_load(0, ServerLoad(running=10, queued=20, gen_throughput=100.0), now=0.0)
    d = pace.deadline(0, 100, sent_at=0.0)
    assert d is not None
    # Two answers' times behind the queue, then its own: 3 x 10 s x (1 + 20/10).
    assert d.seconds == pytest.approx(90.0)
    assert "20 queued behind 10 running" in d.why(3.0)
    pace.observe_load(0, ServerLoad(running=10, queued=0, gen_throughput=100.0), now=1.0)
    assert pace.deadline(0, 100, sent_at=0.0).seconds == pytest.approx(30.0)  # type: ignore[union-attr]


def test_a_retraction_while_a_copy_is_out_gives_it_one_more_turn() -> None:
    pace = _pace()
    pace.observe_load(0, ServerLoad(running=10, queued=0, retracted=5), now=0.0)
    pace.observe_load(0, ServerLoad(running=10, queued=0, retracted=7), now=50.0)
    sent_before = pace.deadline(0, 100, sent_at=40.0)
    sent_after = pace.deadline(0, 100, sent_at=60.0)
    assert sent_before is not None and sent_after is not None
    # It may be one of those sent back: it waits its turn once more.
    assert sent_before.seconds == pytest.approx(60.0) and "retracted" in sent_before.why(3.0)
    assert sent_after.seconds == pytest.approx(30.0)  # sent after: not one of them
    # Another server's retractions are not this one's.
    assert pace.deadline(1, 100, sent_at=40.0).seconds == pytest.approx(30.0)  # type: ignore[union-attr]


def test_a_deadline_still_stops_at_request_timeout() -> None:
    pace = Pace(factor=3.0, min_s=1.0, max_s=120.0)
    for _ in range(8):
        pace.observe(0, 100, 10.0)
    pace.observe_load(0, ServerLoad(running=1, queued=500), now=0.0)
    assert pace.deadline(0, 100, sent_at=0.0).seconds == 120.0  # type: ignore[union-attr]
