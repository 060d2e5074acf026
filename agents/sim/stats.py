"""The simulated scheduler's statistics: Prometheus-style histograms and the activity
window that each decode log line reports."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class Histogram:
    """Bucket counts per label value (`is_streaming`), rendered by `exposition.py`."""

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
    retracted: int = 0  # the newest retraction's size (--max-total-tokens only)


@dataclass
class RankCounters:
    """One DP rank's running totals since start; its log lines report their growth between
    two of its lines, and /server_info its cumulative accept length."""

    tokens: int = 0
    verify: float = 0.0
    new_seqs: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0

    def admitted(self, new_tokens: int, cached_tokens: int) -> None:
        self.new_seqs += 1
        self.new_tokens += new_tokens
        self.cached_tokens += cached_tokens

    def produced(self, tokens: int, verify: float) -> None:
        self.tokens += tokens
        self.verify += verify

    @property
    def accept_length(self) -> float | None:
        return self.tokens / self.verify if self.verify > 0 else None
