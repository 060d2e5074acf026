"""A server's retractions: running requests SGLang sent back to its queue because decoding ran
out of KV room (they start over when room comes back). Counted in all and over the last alert
window from two counters of the same events, SGLang's own (`num_retracted_requests_total`)
and its log's retraction lines: each source's count since watching began is kept, and the
larger is what was seen, so a source that stops answering for a while, or was never there,
loses nothing, and the two never add up twice (one may see an event a reading later)."""

from __future__ import annotations

from collections import deque

from agents.supervise.sglang_metrics import ServerFigures


def counter_step(before: int | None, now: int | None) -> int:
    """What a counter counted between two readings: 0 when either is unknown; a count lower
    than before is a server that started again, counting from 0."""
    if before is None or now is None:
        return 0
    return now - before if now >= before else now


class Retractions:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.seen = 0  # since the supervisor began to watch: only grows
        self._counter: int | None = None
        self._log: int | None = None
        self._by_counter = 0  # what each source counted since watching began
        self._by_log = 0
        # (time, seen) after each reading, the oldest kept at or before the window's start.
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, figures: ServerFigures) -> int:
        """One reading of the server's figures; returns the retractions it adds."""
        self._by_counter += counter_step(self._counter, figures.retracted_total)
        self._by_log += counter_step(self._log, figures.retracted_log)
        # A source that did not answer this time keeps its last count (a counter only grows).
        if figures.retracted_total is not None:
            self._counter = figures.retracted_total
        if figures.retracted_log is not None:
            self._log = figures.retracted_log
        before = self.seen
        self.seen = max(self._by_counter, self._by_log)
        step = self.seen - before
        self._samples.append((now, self.seen))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()
        return step

    def recent(self) -> int:
        """Retractions in the last window_s (since watching began, when that is later)."""
        if not self._samples:
            return 0
        return self.seen - self._samples[0][1]


__all__ = ["Retractions", "counter_step"]
