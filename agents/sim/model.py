"""The simulated GPU behind the SGLang simulator: a capped running batch with a FIFO queue,
throughput that saturates with the batch, seeded output lengths, speculative accept length,
a toy prefix cache and faults. No HTTP here; `server.py` turns it into SGLang's wire formats.

Time: every duration in the config is in simulated seconds; `time_scale` maps it to wall time
(0.001 = everything 1000x faster, 0 = answer at once). Rates and latencies that the model
reports (throughput gauges, histograms) are in wall time, so a client measuring with its own
clock agrees with the server's numbers.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from statistics import NormalDist
from typing import Any

EOS_TOKEN_ID = 151645  # Qwen's <|im_end|>: what `matched_stop` names on a natural stop
THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
LENGTH_REF_TOKENS = 4096  # length scale when a request sets no max_tokens
CACHE_BLOCK_CHARS = 256  # toy radix cache: prompts share prefixes in blocks of ~64 tokens
_TICK_S = 0.01
_MIN_TICK_S = 0.001


def estimate_tokens(text: str) -> int:
    """Deterministic token estimate for prompt text (~4 characters a token)."""
    return max(1, (len(text) + 3) // 4)


@dataclass
class Faults:
    """Faults on demand (flags at start, `POST /sim/faults` later)."""

    error_rate: float = 0.0  # HTTP 500 with an SGLang error body
    hang_rate: float = 0.0  # never answers
    crash_after_requests: int | None = None  # os._exit when request N+1 arrives
    crash_after_seconds: float | None = None  # os._exit after T simulated seconds
    slow_factor: float = 1.0  # divides decode and prefill speed
    garbage_rate: float = 0.0  # 200 with a body that is not JSON
    empty_rate: float = 0.0  # content "" and no reasoning

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply a partial update, all or nothing; ValueError names a bad key or value."""
        known = {f.name for f in fields(self)}
        clean: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in known:
                raise ValueError(f"unknown fault {key!r}; known: {sorted(known)}")
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key.startswith("crash_after") and value is None:
                clean[key] = None
            elif not number or value < 0:
                raise ValueError(f"{key} must be a number >= 0, not {value!r}")
            elif key.endswith("_rate") and value > 1:
                raise ValueError(f"{key} is a share in [0, 1], not {value!r}")
            elif key == "slow_factor" and value == 0:
                raise ValueError("slow_factor must be > 0")
            else:
                clean[key] = int(value) if key == "crash_after_requests" else float(value)
        for key, value in clean.items():
            setattr(self, key, value)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SimConfig:
    max_running_requests: int = 48
    accept_length: float = 3.0  # mean tokens per verify forward; <= 0 turns spec decoding off
    spec_num_steps: int = 3
    spec_num_draft_tokens: int = 4
    time_scale: float = 1.0
    load_seconds: float = 2.0
    seed: int = 0
    truncation_share: float = 0.1  # share of requests that run into their max_tokens
    length_sigma: float = 0.8  # lognormal spread of natural output lengths
    peak_tokens_per_s: float = 250.0  # decode speed of a request running alone
    knee: float = 16.0  # batch size where per-request speed has halved (linear term)
    best_concurrency: float = 40.0  # batch size with the highest total throughput
    prefill_tokens_per_s: float = 40000.0
    tool_call_share: float = 0.5  # share of requests with tools that answer with a call
    context_length: int = 40960
    max_total_num_tokens: int = 500_000
    faults: Faults = field(default_factory=Faults)

    @property
    def spec(self) -> bool:
        return self.accept_length > 0

    def wall(self, sim_seconds: float) -> float:
        """Wall seconds for a simulated duration (timers keep their length at time_scale 0)."""
        return sim_seconds * self.time_scale if self.time_scale > 0 else sim_seconds

    def per_request_rate(self, batch: int) -> float:
        """Simulated decode tokens/s of each request in a batch of `batch`.

        Total = b * peak / (1 + b/knee + (b/best)^2): rises almost linearly, bends at the knee,
        peaks exactly at best_concurrency and then declines gently (KV pressure)."""
        b = max(1, batch)
        return self.peak_tokens_per_s / (1 + b / self.knee + (b / self.best_concurrency) ** 2)

    def total_rate(self, batch: int) -> float:
        return batch * self.per_request_rate(batch)


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """What one request will generate. Token layout with thinking: `<think>` (1 token),
    reasoning words (reasoning_len), `</think>` (1 token), answer words or one tool call."""

    n_tokens: int
    finish: str  # "stop" | "length"
    thinking: bool
    reasoning_len: int
    accept_length: float
    offset: int
    tool_name: str | None = None
    tool_arguments: str = "{}"
    empty: bool = False  # the "empty" fault: only an end-of-sequence token, no text

    @property
    def reasoning_tokens(self) -> int:
        """Tokens up to and including `</think>` among the n_tokens generated."""
        return min(self.n_tokens, self.reasoning_len + 2) if self.thinking else 0

    def reasoning_tokens_at(self, n: int) -> int:
        return min(n, self.reasoning_len + 2) if self.thinking else 0

    def verify_ct(self, n: int) -> int:
        return math.ceil(n / self.accept_length) if n > 0 else 0


@dataclass(frozen=True, slots=True)
class Piece:
    reasoning: str  # reasoning text (no tags)
    content: str  # answer text (no tags; empty for a tool call)
    raw: str  # the model's raw text with the think tags, without tool-call markup
    call: str = ""  # raw tool-call markup, in the piece that ends the call

    @property
    def full(self) -> str:
        """All the model printed: what /generate and /v1/completions return."""
        return self.raw + self.call


class TextBank:
    """Cheap deterministic pseudo-words: slices of one seeded word list."""

    _SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "re",
                  "fi", "gu", "ha", "jo", "be", "to", "an", "el")

    def __init__(self, seed: int, size: int = 1 << 15) -> None:
        rng = random.Random(seed * 7919 + 17)
        vocab = []
        for i in range(4096):
            word = "".join(rng.choice(self._SYLLABLES) for _ in range(rng.randint(1, 3)))
            vocab.append(word + ("," if i % 13 == 0 else "." if i % 17 == 0 else ""))
        picks = [rng.randrange(len(vocab)) for _ in range(size)]
        self.size = size
        self.words = [vocab[i] for i in picks]
        self.ids = [1000 + i for i in picks]

    def words_at(self, start: int, count: int) -> list[str]:
        start %= self.size
        out = self.words[start:start + count]
        while len(out) < count:
            out.extend(self.words[: count - len(out)])
        return out

    def ids_at(self, start: int, count: int) -> list[int]:
        start %= self.size
        out = self.ids[start:start + count]
        while len(out) < count:
            out.extend(self.ids[: count - len(out)])
        return out

    def join(self, base: int, i: int, j: int) -> str:
        """Words i..j-1 of the stream starting at base; pieces concatenate to the whole."""
        if j <= i:
            return ""
        text = " ".join(self.words_at(base + i, j - i))
        return " " + text if i > 0 else text

    def pieces(self, plan: OutputPlan, a: int, b: int) -> Piece:
        """Text of tokens [a, b) of a plan."""
        b = min(b, plan.n_tokens)
        if b <= a or plan.empty:
            return Piece("", "", "")
        if plan.thinking:
            r = plan.reasoning_len
            opened = a == 0
            reasoning = self.join(plan.offset, max(a, 1) - 1, min(b, r + 1) - 1)
            closed = a <= r + 1 < b
            ans_a, ans_b = max(a, r + 2) - (r + 2), b - (r + 2)
        else:
            opened = closed = False
            reasoning = ""
            ans_a, ans_b = a, b
        content = call = ""
        if ans_b > ans_a:
            if plan.tool_name is not None:
                answer_len = plan.n_tokens - (plan.reasoning_len + 2 if plan.thinking else 0)
                if ans_b >= answer_len:
                    call = ('<tool_call>\n{"name": "' + plan.tool_name + '", "arguments": '
                            + plan.tool_arguments + "}\n</tool_call>")
            else:
                content = self.join(plan.offset + plan.reasoning_len + 1, ans_a, ans_b)
        raw = (THINK_OPEN if opened else "") + reasoning + (THINK_CLOSE if closed else "")
        return Piece(reasoning, content, raw + content, call)


@dataclass(eq=False)
class SimRequest:
    rid: str
    plan: OutputPlan
    prompt_tokens: int
    cached_tokens: int
    is_streaming: bool
    created: float
    health: bool = False
    admitted: float | None = None
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


class Histogram:
    """Bucket counts per label value (`is_streaming`), rendered by the server."""

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = sorted(bounds)
        self.counts: dict[str, list[int]] = {}
        self.sums: dict[str, float] = {}

    def observe(self, key: str, value: float) -> None:
        counts = self.counts.setdefault(key, [0] * (len(self.bounds) + 1))
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
        self.sums[key] = self.sums.get(key, 0.0) + value


@dataclass
class Window:
    """Scheduler activity between two decode log lines (running and used_tokens: peaks)."""

    running: int = 0
    queued: int = 0
    used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    accept_length: float = 0.0
    accept_rate: float = 0.0
    cache_hit_rate: float = 0.0
    new_seqs: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0
    input_throughput: float = 0.0
    tokens: int = 0


class SimModel:
    """The simulated server state: scheduler, statistics, counters, faults."""

    def __init__(self, config: SimConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = config
        self.clock = clock
        self.rng = random.Random(config.seed)
        self.fault_rng = random.Random(config.seed + 1_000_003)
        self.bank = TextBank(config.seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.ready = False
        self.paused = False
        self._wake = asyncio.Event()
        self._z_cache: dict[float, float] = {}
        self._prefix_cache: set[int] = set()
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
        f = self.cfg.faults
        if (f.crash_after_requests is not None
                and self._requests_since_faults > f.crash_after_requests):
            return "crash"
        draw = self.fault_rng.random()
        for name, rate in (("error", f.error_rate), ("hang", f.hang_rate),
                           ("garbage", f.garbage_rate), ("empty", f.empty_rate)):
            if draw < rate:
                return name
            draw -= rate
        return None

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

    def _z(self, share: float) -> float:
        p = min(max(share, 1e-4), 1 - 1e-4)
        if p not in self._z_cache:
            self._z_cache[p] = NormalDist().inv_cdf(1 - p)
        return self._z_cache[p]

    def plan_output(self, max_tokens: int | None, prompt_tokens: int, thinking: bool = True,
                    tools: list[Any] | None = None, empty: bool = False,
                    ignore_eos: bool = False) -> OutputPlan:
        """Draw an output: a lognormal natural length scaled so that `truncation_share` of
        requests reach their max_tokens, reasoning first when thinking, maybe a tool call."""
        cfg = self.cfg
        rng = self.rng
        accept = 1.0
        if cfg.spec:
            accept = min(cfg.spec_num_steps + 1.0, max(1.0, rng.gauss(cfg.accept_length, 0.3)))
        offset = rng.randrange(self.bank.size)
        if empty:
            return OutputPlan(1, "stop", False, 0, accept, offset, empty=True)
        room = max(1, cfg.context_length - prompt_tokens)
        cap = min(max_tokens, room) if max_tokens and max_tokens > 0 else room
        ref = max_tokens if max_tokens and max_tokens > 0 else LENGTH_REF_TOKENS
        z = rng.gauss(0.0, 1.0)
        natural = max(1, math.ceil(ref * math.exp(cfg.length_sigma * (z - self._z(
            cfg.truncation_share)))))
        reasoning = 0
        if thinking:
            natural = max(natural, 3)
            reasoning = min(natural - 3, round(natural * rng.uniform(0.55, 0.85)))
        if natural >= cap or ignore_eos:
            return OutputPlan(cap, "length", thinking, reasoning, accept, offset)
        if tools and rng.random() < cfg.tool_call_share:
            name, arguments = self._tool_call(tools, rng, offset)
            if name is not None:
                return OutputPlan(natural, "stop", thinking, reasoning, accept, offset,
                                  name, arguments)
        return OutputPlan(natural, "stop", thinking, reasoning, accept, offset)

    def _tool_call(self, tools: list[Any], rng: random.Random,
                   offset: int) -> tuple[str | None, str]:
        tool = tools[rng.randrange(len(tools))]
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return None, "{}"
        params = fn.get("parameters")
        params = params if isinstance(params, dict) else {}
        props = params.get("properties")
        props = props if isinstance(props, dict) else {}
        required = params.get("required")
        required = required if isinstance(required, list) else []
        keys = [k for k in required if isinstance(k, str)] or list(props)[:2]
        words = self.bank.words_at(offset + 101, len(keys))
        args = {k: w.rstrip(",.") for k, w in zip(keys, words, strict=True)}
        return fn["name"], json.dumps(args)

    def submit(self, rid: str, plan: OutputPlan, prompt_tokens: int, cached_tokens: int,
               is_streaming: bool, health: bool = False) -> SimRequest:
        now = self.clock()
        req = SimRequest(rid, plan, prompt_tokens, cached_tokens, is_streaming, now, health)
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
        if self._can_progress():
            self._admit(now)  # a free slot takes it at once; the loop picks it up next tick
        self._wake.set()
        return req

    def abort(self, rid: str | None = None, abort_all: bool = False,
              message: str = "Abort by user request") -> int:
        now = self.clock()
        hits = [r for r in (*self.running, *self.waiting) if abort_all or r.rid == rid]
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
            self._admit(now)
            until_next = self._advance(dt, now)
            await asyncio.sleep(min(_TICK_S, max(_MIN_TICK_S, until_next)))

    def _admit(self, now: float) -> None:
        cfg = self.cfg
        while self.waiting and len(self.running) < cfg.max_running_requests:
            r = self.waiting.popleft()
            if r.admitted is None:
                r.admitted = now
                new = r.prompt_tokens - r.cached_tokens
                r.prefill_left = new / cfg.prefill_tokens_per_s
                if not r.health:
                    self._win.new_seqs += 1
                    self._win.new_tokens += new
                    self._win.cached_tokens += r.cached_tokens
                    self._win_prompt += r.prompt_tokens
            self.running.append(r)

    def _advance(self, dt: float, now: float) -> float:
        """Move the batch on by dt wall seconds; return wall seconds to the next finish."""
        cfg = self.cfg
        speed = 1.0 / (cfg.time_scale * cfg.faults.slow_factor)  # simulated s per wall s
        rate = cfg.per_request_rate(len(self.running))
        sim_dt = dt * speed
        until_next = math.inf
        finished = False
        win = self._win
        win.running = max(win.running, len(self.running))
        win.used_tokens = max(win.used_tokens, self.used_tokens())
        for r in list(self.running):
            # admitted since the last tick: only the time since its admission counts
            left = min(sim_dt, (now - (r.admitted or now)) * speed)
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
        r.changed.set()

    def _finish(self, r: SimRequest, finish: str, now: float, message: str = "") -> None:
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
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
            "requests_total": self.requests_total,
            "finished_total": self.finished_total,
            "aborted_total": self.aborted_total,
            "last_max_tokens": list(self.last_max_tokens),
            "max_tokens_counts": dict(self.max_tokens_counts),
            "faults": self.cfg.faults.as_dict(),
        }
