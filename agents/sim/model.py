"""The simulated GPU behind the SGLang simulator: a capped running batch with a FIFO queue,
a toy prefix cache, counters and fault state, in simulated time (see `config.py`); no HTTP."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.sim.config import SimConfig
from agents.sim.kvpool import KVPool
from agents.sim.output import OutputPlan, OutputPlanner
from agents.sim.stats import Histogram, RankCounters, Window

CACHE_BLOCK_CHARS = 256  # toy radix cache: prompts share prefixes in blocks of ~64 tokens
_TICK_S = 0.01
_MIN_TICK_S = 0.001
# SGLang's words (schedule_batch.py retract_decode, scheduler.py _abort_on_queued_limit).
OUT_OF_KV = ("Out of memory even after retracting all other requests in the decode batch. "
             "Aborting the last request.")
QUEUE_FULL = "The request queue is full."


@dataclass(eq=False)
class SimRequest:
    rid: str
    plan: OutputPlan
    prompt_tokens: int
    cached_tokens: int
    is_streaming: bool
    created: float
    health: bool = False
    dp_rank: int = 0  # the DP rank that serves it (round robin at admission)
    hung: bool = False  # the hang fault: never scheduled, ends only when aborted
    max_new: int = 0  # the max_new_tokens asked for (what the KV pool reserves against)
    ignore_eos: bool = False
    admitted: float | None = None  # first admission
    joined: float | None = None  # (re)joined the running batch
    retractions: int = 0
    abort_status: int | None = None  # an abort's HTTP status (503 queue full, 500 no KV)
    first_token_at: float | None = None
    finished_at: float | None = None
    prefill_left: float = 0.0  # simulated seconds of prefill still to run
    progress: float = 0.0  # tokens generated (fractional while decoding)
    generated: int = 0
    finish: str | None = None  # "stop" | "length" | "abort" once done
    abort_message: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def verify_ct(self) -> int:
        return self.plan.verify_ct(self.generated)


class SimModel:
    """The simulated server state: scheduler, statistics, counters, faults."""

    def __init__(self, config: SimConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = config
        self.clock = clock
        self.planner = OutputPlanner(config)
        self.rng = self.planner.rng
        self.bank = self.planner.bank
        self.fault_rng = random.Random(config.seed + 1_000_003)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        # every request not finished, by rid (SGLang's rid_to_state); hung ones apart
        self.by_rid: dict[str, SimRequest] = {}
        self.hung: dict[str, SimRequest] = {}
        self.ready = False
        self.paused = False
        self._wake = asyncio.Event()
        self._prefix_cache: set[int] = set()
        # --max-total-tokens: KV admission and retraction (else no KV limit is modelled)
        self.pool = (KVPool(config.max_total_num_tokens * max(1, config.dp_size))
                     if config.kv_limit else None)
        self.log_event: Callable[[str], None] = lambda line: None  # a WARNING line
        # per DP rank (--dp-size): what each rank's own log lines report
        self.ranks = [RankCounters() for _ in range(max(1, config.dp_size))]
        self._next_rank = 0
        self.rank_last: dict[int, Window] = {}  # each rank's last line (its gauges)
        # what clients sent and how many are being served (for /sim/state)
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests_total = 0
        self.finished_total = 0
        self.last_max_tokens: deque[int | None] = deque(maxlen=32)
        self.max_tokens_counts: Counter[str] = Counter()
        self._requests_since_faults = 0
        self.crash_deadline: float | None = None
        self.set_faults({})
        # counters and histograms (bumped when a request finishes), keyed by is_streaming
        self.prompt_tokens_total: Counter[str] = Counter()
        self.generation_tokens_total: Counter[str] = Counter()
        self.num_requests_total: Counter[str] = Counter()
        self.aborted_total = 0
        self.abort_requests = 0  # POST /abort_request calls (by rid or all)
        self.verify_calls_total = 0
        self.cached_tokens_total = 0
        self.ttft = Histogram([0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100,
                               200, 400])
        self.itl = Histogram([0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03,
                              0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8])
        self.e2e = Histogram([0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100,
                              200, 400, 600, 1200, 1800, 2400])
        self.queue_time = Histogram([0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50,
                                     60, 80, 100, 200, 300, 400, 500, 600, 900, 1200, 1800])
        # the decode-log window and what was folded in at the last log line
        self._win = Window()
        self._win_start = clock()
        self._win_verify = 0.0
        self._win_prompt = 0
        self.last = Window()
        self.last_output_at = 0.0
        self._acc_tokens = 0
        self._acc_verify = 0.0
        self.avg_spec_accept_length: float | None = None

    # ----- requests in and out -----

    def set_faults(self, changes: Mapping[str, Any]) -> None:
        self.cfg.faults.update(changes)
        f = self.cfg.faults
        if "crash_after_requests" in changes or not changes:
            self._requests_since_faults = 0
        if "crash_after_seconds" in changes or not changes:
            self.crash_deadline = (None if f.crash_after_seconds is None
                                   else self.clock() + self.cfg.wall(f.crash_after_seconds))

    def begin_request(self, max_tokens: int | None) -> str | None:
        """Count an arriving generation request; return the fault it meets, if any:
        "crash", "error", "hang", "garbage" or "empty"."""
        self.requests_total += 1
        self._requests_since_faults += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.last_max_tokens.append(max_tokens)
        self.max_tokens_counts[str(max_tokens) if max_tokens is not None else "none"] += 1
        return self.cfg.faults.draw(self.fault_rng, self._requests_since_faults)

    def end_request(self) -> None:
        self.in_flight -= 1

    def cached_prefix_tokens(self, text: str) -> int:
        """Toy radix cache: leading blocks seen before count as cached; remember them all."""
        h = 0
        cached = 0
        matching = True
        cache = self._prefix_cache
        if len(cache) > 1_000_000:
            cache.clear()
        for start in range(0, len(text) - CACHE_BLOCK_CHARS + 1, CACHE_BLOCK_CHARS):
            h = hash((h, text[start:start + CACHE_BLOCK_CHARS]))
            if matching and h in cache:
                cached += CACHE_BLOCK_CHARS // 4
            else:
                matching = False
                cache.add(h)
        return cached

    def flush_cache(self) -> bool:
        if self.running or self.waiting:
            return False
        self._prefix_cache.clear()
        return True

    def plan_output(self, max_tokens: int | None, prompt_tokens: int, thinking: bool = True,
                    tools: list[Any] | None = None, empty: bool = False,
                    ignore_eos: bool = False, prompt: str | None = None) -> OutputPlan:
        """Draw what a request will generate (see `OutputPlanner.plan`)."""
        return self.planner.plan(max_tokens, prompt_tokens, thinking, tools, empty, ignore_eos,
                                 prompt)

    def holds(self, rid: str) -> bool:
        """A request with this rid is still in the server (SGLang refuses a second one)."""
        return rid in self.by_rid

    def submit(self, rid: str, plan: OutputPlan, prompt_tokens: int, cached_tokens: int,
               is_streaming: bool, health: bool = False, hung: bool = False,
               max_new: int | None = None, ignore_eos: bool = False) -> SimRequest:
        now = self.clock()
        limit = max_new if max_new is not None else self.cfg.context_length - prompt_tokens
        req = SimRequest(rid, plan, prompt_tokens, cached_tokens, is_streaming, now, health,
                         hung=hung, max_new=max(limit, plan.n_tokens), ignore_eos=ignore_eos)
        self.by_rid[rid] = req
        queued = self.cfg.max_queued_requests
        if queued is not None and not health and len(self.waiting) >= queued:
            req.abort_status = 503  # --max-queued-requests: refused at arrival
            self._finish(req, "abort", now, QUEUE_FULL)
            return req
        if hung:  # stuck in the server: no output until /abort_request or a disconnect
            self.hung[rid] = req
            return req
        if self.cfg.time_scale <= 0:  # no-delay mode: the answer is ready at once
            req.admitted = req.first_token_at = now
            req.progress = plan.n_tokens
            self._win.new_seqs += 1
            self._win.new_tokens += prompt_tokens - cached_tokens
            self._win.cached_tokens += cached_tokens
            self._win_prompt += prompt_tokens
            self._produce(req, plan.n_tokens, now)
            self._finish(req, plan.finish, now)
            return req
        self.waiting.append(req)
        if self._can_progress() and self.pool is None:
            # A free slot takes it at once; the loop picks it up next tick. With a KV pool,
            # the next tick admits what arrived meanwhile in one round, as SGLang's
            # scheduler does between two steps (each newcomer reserved in full).
            self._admit(now)
        self._wake.set()
        return req

    def abort(self, rid: str | None = None, abort_all: bool = False,
              message: str = "Aborted") -> int:
        now = self.clock()
        hits = [r for r in (*self.running, *self.waiting, *self.hung.values())
                if abort_all or r.rid == rid]
        for r in hits:
            queued = r in self.waiting
            self._finish(r, "abort", now, "Abort in waiting queue" if queued else message)
        return len(hits)

    def pause(self, mode: str) -> None:
        """SGLang's pause modes: abort (default) ends everything, retract puts the running
        batch back at the head of the queue, in_place freezes it."""
        self.paused = True
        if mode == "abort":
            self.abort(abort_all=True, message="Abort by pause_generation")
        elif mode == "retract":
            for r in reversed(self.running):
                self.waiting.appendleft(r)
            self.running.clear()

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    def set_ready(self) -> None:
        self.ready = True
        self._wake.set()

    # ----- the scheduler loop -----

    def _can_progress(self) -> bool:
        if not self.ready or self.paused:
            return False
        return bool(self.running or self.waiting)

    async def run(self) -> None:
        last = self.clock()
        while True:
            if not self._can_progress():
                self._wake.clear()
                await self._wake.wait()
                last = self.clock()
                continue
            now = self.clock()
            dt, last = now - last, now
            until_next = self.tick(dt)
            await asyncio.sleep(min(_TICK_S, max(_MIN_TICK_S, until_next)))

    def tick(self, dt: float) -> float:
        """One scheduler step at the clock's time, dt wall seconds after the last: admit from
        the queue, move the batch on; returns wall seconds to the next finish."""
        now = self.clock()
        self._admit(now)
        return self._advance(dt, now)

    def _admit(self, now: float) -> None:
        """From the head of the queue while the batch cap (and with a KV pool, its room)
        allows: FIFO, so a head that does not fit holds back the rest."""
        cfg, pool = self.cfg, self.pool
        ran = list(self.running)  # the batch of the last step; newcomers reserve in full
        pending = 0.0
        while self.waiting and len(self.running) < cfg.max_running_requests:
            r = self.waiting[0]
            # With nothing running the head goes in whatever it needs (SGLang's too).
            if pool is not None and not r.health:
                if self.running and (pool.blocked or not pool.fits(ran, pending, r)):
                    pool.refusals += not pool.blocked
                    pool.blocked = True
                    break
                pending += pool.need(r)
            self.waiting.popleft()
            self._join(r, now)

    def _join(self, r: SimRequest, now: float) -> None:
        cfg = self.cfg
        r.joined = now
        if r.admitted is None:
            r.admitted = now
            r.dp_rank = self._next_rank % len(self.ranks)
            self._next_rank += 1
            new, cached = r.prompt_tokens - r.cached_tokens, r.cached_tokens
        else:  # back from a retraction: its prompt and its output are computed again
            new, cached = r.prompt_tokens + r.generated, 0
        r.prefill_left = new / cfg.prefill_tokens_per_s
        if not r.health:
            self.ranks[r.dp_rank].admitted(new, cached)
            self._win.new_seqs += 1
            self._win.new_tokens += new
            self._win.cached_tokens += cached
            self._win_prompt += new + cached
        self.running.append(r)

    def _fit_pool(self, tokens: float, now: float) -> None:
        """Before the batch decodes `tokens` more each: retract what does not fit."""
        pool = self.pool
        assert pool is not None
        event = pool.step(self.running, tokens)
        if event is not None:
            for v in event.victims:
                self.running.remove(v)
                v.retractions += 1
                v.prefill_left = 0.0
                v.joined = None
                self.waiting.append(v)  # FCFS: at the back, as SGLang re-queues it
            self.log_event(event.log_line())
        if pool.overflows_alone(self.running, tokens):
            last = self.running[0]
            last.abort_status = 500
            self._finish(last, "abort", now, OUT_OF_KV)

    def _advance(self, dt: float, now: float) -> float:
        """Move the batch on by dt wall seconds; return wall seconds to the next finish."""
        cfg = self.cfg
        speed = 1.0 / (cfg.time_scale * cfg.faults.slow_factor)  # simulated s per wall s
        rate = cfg.per_request_rate(len(self.running))
        sim_dt = dt * speed
        if self.pool is not None and self.running:
            self._fit_pool(rate * sim_dt, now)
            rate = cfg.per_request_rate(len(self.running))
        until_next = math.inf
        finished = False
        win = self._win
        win.running = max(win.running, len(self.running))
        win.used_tokens = max(win.used_tokens, self.used_tokens())
        for r in list(self.running):
            # joined since the last tick: only the time since it joined counts
            joined = r.joined if r.joined is not None else now
            left = min(sim_dt, (now - joined) * speed)
            if r.prefill_left > 0:
                used = min(r.prefill_left, left)
                r.prefill_left -= used
                left -= used
                if r.prefill_left <= 1e-12:
                    r.prefill_left = 0.0
                    r.progress += 1  # prefill ends with the first token
            if left > 0 and r.prefill_left == 0:
                r.progress += rate * left
            n = min(int(r.progress), r.plan.n_tokens)
            if n > r.generated:
                self._produce(r, n, now)
            if r.generated >= r.plan.n_tokens:
                self._finish(r, r.plan.finish, now)
                finished = True
            else:
                need = r.prefill_left + (r.plan.n_tokens - r.progress) / rate
                until_next = min(until_next, need / speed)
        if finished and self.waiting:
            self._admit(now)  # freed slots go to the queue at once, as in a real scheduler
            until_next = min(until_next, _MIN_TICK_S)
        return until_next

    def _produce(self, r: SimRequest, n: int, now: float) -> None:
        delta = n - r.generated
        if r.first_token_at is None:
            r.first_token_at = now
        r.generated = n
        self.last_output_at = now
        if not r.health:
            self._win.tokens += delta
            self._win_verify += delta / r.plan.accept_length
            self.ranks[r.dp_rank].produced(delta, delta / r.plan.accept_length)
        r.changed.set()

    def _finish(self, r: SimRequest, finish: str, now: float, message: str = "") -> None:
        if r in self.running:
            self.running.remove(r)
            if self.pool is not None:
                self.pool.blocked = False  # a request left: admission is tried again
        elif r in self.waiting:
            self.waiting.remove(r)
        elif r.hung:
            self.hung.pop(r.rid, None)
        if self.pool is not None and not self.running and not self.waiting:
            self.pool.idle()
        if self.by_rid.get(r.rid) is r:
            del self.by_rid[r.rid]
        r.finish = finish
        r.abort_message = message
        r.finished_at = now
        r.done.set()
        r.changed.set()
        if r.health:
            return
        key = "true" if r.is_streaming else "false"
        self.finished_total += 1
        self.num_requests_total[key] += 1
        self.prompt_tokens_total[key] += r.prompt_tokens
        self.generation_tokens_total[key] += r.generated
        self.cached_tokens_total += r.cached_tokens if r.admitted is not None else 0
        if self.cfg.spec:
            self.verify_calls_total += r.verify_ct
        if finish == "abort":
            self.aborted_total += 1
        self.e2e.observe(key, now - r.created)
        if r.admitted is not None:
            self.queue_time.observe("", r.admitted - r.created)
        if r.first_token_at is not None:
            self.ttft.observe(key, r.first_token_at - r.created)
            if r.generated > 1:
                self.itl.observe("", (now - r.first_token_at) / (r.generated - 1))

    # ----- statistics -----

    def used_tokens(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self.running)

    def take_window(self) -> Window:
        """Close the decode-log window: what the log line, the gauges and
        `last_gen_throughput` report; folds the window into avg_spec_accept_length."""
        now = self.clock()
        w, verify, prompt = self._win, self._win_verify, self._win_prompt
        elapsed = max(now - self._win_start, 1e-9)
        # the busiest batch of the window: at high time scales requests come and go between
        # two log lines, and a line saying "#running-req: 0" after decoding would mislead
        w.running = max(w.running, len(self.running))
        w.used_tokens = max(w.used_tokens, self.used_tokens())
        w.queued = len(self.waiting)
        w.token_usage = w.used_tokens / self.cfg.max_total_num_tokens
        w.gen_throughput = w.tokens / elapsed
        w.input_throughput = w.new_tokens / elapsed
        if verify > 0:
            w.accept_length = w.tokens / verify
            w.accept_rate = (w.tokens - verify) / (verify * self.cfg.spec_num_steps)
            self._acc_tokens += w.tokens
            self._acc_verify += verify
            self.avg_spec_accept_length = self._acc_tokens / self._acc_verify
        else:
            w.accept_length, w.accept_rate = self.last.accept_length, self.last.accept_rate
        w.cache_hit_rate = w.cached_tokens / prompt if prompt else self.last.cache_hit_rate
        if self.pool is not None:  # sglang:num_retracted_reqs: the newest event, then 0
            w.retracted, self.pool.last_event_reqs = self.pool.last_event_reqs, 0
        self.last = w
        self._win, self._win_verify, self._win_prompt = Window(), 0.0, 0
        self._win_start = now
        return w

    def reset_accept_counters(self) -> None:
        self._acc_tokens, self._acc_verify = 0, 0.0
        self.avg_spec_accept_length = None

    def state(self) -> dict[str, Any]:
        """`GET /sim/state`: what tests need to check what a client did."""
        return {
            "ready": self.ready,
            "paused": self.paused,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "running": len(self.running),
            "queued": len(self.waiting),
            "hung": len(self.hung),
            "requests_total": self.requests_total,
            "finished_total": self.finished_total,
            "aborted_total": self.aborted_total,
            "abort_requests": self.abort_requests,
            "last_max_tokens": list(self.last_max_tokens),
            "max_tokens_counts": dict(self.max_tokens_counts),
            "faults": self.cfg.faults.as_dict(),
            "kv": None if self.pool is None else {
                "size": self.pool.size, "used": self.used_tokens(),
                "new_token_ratio": self.pool.ratio, "blocked": self.pool.blocked,
                "refusals": self.pool.refusals,
                "retracted_reqs_total": self.pool.retracted_reqs_total},
        }
