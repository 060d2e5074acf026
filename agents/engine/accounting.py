"""Run totals and rates, and the progress.json they make: the ETA with its p10-p90 band,
GPU-hours and what they cost. Counted when lines are durable; recount.py carries them across
restarts and power losses."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from agents.ewma import EwmaRate
from agents.rundir.schema import Progress, ServerProgress, cost_of


@dataclass(slots=True)
class Totals:
    """Cumulative counters of a run, carried across restarts by totals.json and a recount of
    the lines after it (recount.py); `add_line` is the one rule both live counting and the
    recount follow."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    truncated: int = 0  # current lines here that stopped at max_tokens
    loops: int = 0  # of those, the ones that ended in a repetition loop (loops.py)
    empty: int = 0
    retried: int = 0  # tries of a request sent again (not in any line: carried, not recounted)
    lines: int = 0  # batch lines written, every attempt
    gpu_hours: float = 0.0  # earlier engines' (not in any line: carried, not recounted)
    answers_by_limit: dict[str, int] = field(default_factory=dict)
    truncated_by_limit: dict[str, int] = field(default_factory=dict)
    # A bit per index: its current line here stopped at max_tokens (grown as indices come).
    cut: bytearray = field(default_factory=bytearray)
    # A bit per index: its current line here is truncated and ended in a loop. What `retry
    # truncated --long-only` leaves out.
    looped: bytearray = field(default_factory=bytearray)

    def add_line(self, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int,
                 finish_reason: str, max_tokens: int, attempt: int, empty: bool,
                 index: int, loop: bool = False) -> None:
        """One batch line of `index`. A line above attempt 1 supersedes the index's current
        line here, which counted as truncated only if its bit is set: on one node `retry
        truncated` is the only way to a second attempt of an index with a line, but on a
        campaign node the line a retry generation replaces may be another node's (or a line
        of this node's that lost its chunk's commit, cut or not). So `truncated` is never
        below the bits set, never negative. `loop`: a truncated line that ended in a
        repetition loop (loops.is_loop of its tail), judged off the loop by the caller."""
        self.lines += 1
        self.input_tokens += prompt_tokens
        self.output_tokens += completion_tokens
        self.reasoning_tokens += reasoning_tokens
        truncated = finish_reason == "length"
        byte, mask = index >> 3, 1 << (index & 7)
        if byte >= len(self.cut):
            self.cut.extend(bytes(byte + 1 - len(self.cut)))
        if byte >= len(self.looped):
            self.looped.extend(bytes(byte + 1 - len(self.looped)))
        if attempt > 1 and self.cut[byte] & mask:
            self.truncated -= 1
            self.cut[byte] &= ~mask
            if self.looped[byte] & mask:
                self.loops -= 1
                self.looped[byte] &= ~mask
        if truncated:
            self.truncated += 1
            self.cut[byte] |= mask
            if loop:
                self.loops += 1
                self.looped[byte] |= mask
        self.empty += empty
        self.count_answer(max_tokens, truncated)

    def count_answer(self, max_tokens: int, truncated: bool) -> None:
        """One answer written at `max_tokens`: the per-limit counts alerts judge by."""
        key = str(max_tokens)
        self.answers_by_limit[key] = self.answers_by_limit.get(key, 0) + 1
        if truncated:
            self.truncated_by_limit[key] = self.truncated_by_limit.get(key, 0) + 1

    def is_looped(self, index: int) -> bool:
        """The current line of `index` here is truncated in a loop."""
        byte = index >> 3
        return byte < len(self.looped) and bool(self.looped[byte] & (1 << (index & 7)))


@dataclass(slots=True)
class RateSpread:
    """How the completion rate varied lately: rates over successive `bucket_s` spans of the
    last `window_s`, whose p10 and p90 bound the ETA."""

    window_s: float = 1200.0
    bucket_s: float = 60.0
    min_buckets: int = 3
    _samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, now: float, completed: int) -> None:
        s = self._samples
        if s and now - s[-1][0] < 1.0:
            return
        if s and completed < s[-1][1]:
            s.clear()  # counted again from less (a retry superseding lines): start over
        s.append((now, completed))
        while len(s) > 2 and now - s[1][0] >= self.window_s:
            s.popleft()

    def rates(self) -> list[float]:
        out: list[float] = []
        start: tuple[float, int] | None = None
        for t, c in self._samples:
            if start is None:
                start = (t, c)
            elif t - start[0] >= self.bucket_s:
                out.append((c - start[1]) / (t - start[0]))
                start = (t, c)
        return out

    def band(self) -> tuple[float, float] | None:
        """(p10, p90) of the recent rate, per second; None until min_buckets spans are in."""
        rates = self.rates()
        if len(rates) < self.min_buckets:
            return None
        q = statistics.quantiles(rates, n=10, method="inclusive")
        return q[0], q[-1]


@dataclass(slots=True)
class Meter:
    totals: Totals
    started_at: float = field(default_factory=time.time)
    rate: EwmaRate = field(default_factory=lambda: EwmaRate(60.0))
    gpus: int = 0  # GPUs this run holds (one per server)
    cost_per_gpu_hour: float | None = None
    spread: RateSpread = field(default_factory=RateSpread)
    since_mono: float = field(default_factory=time.monotonic)  # this engine's start

    def eta_hours(self, remaining: int) -> float | None:
        r = self.rate.rate
        if remaining <= 0:
            return 0.0
        return remaining / r / 3600.0 if r > 0 else None

    def gpu_hours(self, now: float | None = None) -> float:
        """GPU-hours so far: earlier engines' (recount.py) and this one's."""
        now = time.monotonic() if now is None else now
        return self.totals.gpu_hours + self.gpus * max(0.0, now - self.since_mono) / 3600.0

    def annotate(self, p: Progress, now: float | None = None) -> Progress:
        """Add the ETA band and the cost to a progress record (`now`: monotonic)."""
        now = time.monotonic() if now is None else now
        self.spread.add(now, p.completed + p.failed)
        remaining = p.total - p.completed - p.failed
        band = self.spread.band()
        if remaining <= 0:
            p.eta_p10_hours = p.eta_p90_hours = 0.0
        elif band is not None:
            lo_rate, hi_rate = band
            fast = remaining / hi_rate / 3600.0 if hi_rate > 0 else None
            slow = remaining / lo_rate / 3600.0 if lo_rate > 0 else None
            if p.eta_hours is not None:
                fast = min(fast, p.eta_hours) if fast is not None else p.eta_hours
                slow = max(slow, p.eta_hours) if slow is not None else None
            p.eta_p10_hours = round(fast, 4) if fast is not None else None
            p.eta_p90_hours = round(slow, 4) if slow is not None else None
        p.gpus = self.gpus
        p.gpu_hours = round(self.gpu_hours(now), 4)
        p.cost = cost_of(self.cost_per_gpu_hour, p.gpus, p.gpu_hours, p.total_output_tokens,
                         p.eta_hours)
        return p


def server_progress(number: int, url: str, state: str, in_flight: int, limit: int,
                    completed: int, failed: int, req_per_s: float, tok_per_s: float,
                    accept_length: float | None, errors_in_row: int,
                    last_error: str | None) -> tuple[str, ServerProgress]:
    return str(number), ServerProgress(
        url=url, state=state,  # type: ignore[arg-type]
        in_flight=in_flight, limit=limit, completed=completed, failed=failed,
        req_per_s=round(req_per_s, 3), tok_per_s=round(tok_per_s, 1),
        accept_length=round(accept_length, 3) if accept_length is not None else None,
        errors_in_row=errors_in_row, last_error=last_error,
    )


__all__ = ["Meter", "Progress", "RateSpread", "Totals", "server_progress"]
