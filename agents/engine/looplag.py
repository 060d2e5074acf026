"""The event loop's stalls, measured as the engine runs: a task sleeps TICK_S and notes how
late it woke. A stall holds everything the engine does (dispatch, health checks, RPC replies,
the status push), so its worst is in every snapshot: over the last minute and since start."""

from __future__ import annotations

import asyncio
import time
from collections import deque

TICK_S = 0.1
WINDOW_S = 60.0


class LoopLag:
    def __init__(self) -> None:
        self.worst_ms = 0.0
        self._recent: deque[tuple[float, float]] = deque()  # (when, ms), worst kept first

    def observe(self, lag_s: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        ms = max(0.0, lag_s * 1000)
        self.worst_ms = max(self.worst_ms, ms)
        # A monotonic deque: each entry outlives every smaller one before it.
        while self._recent and self._recent[-1][1] <= ms:
            self._recent.pop()
        self._recent.append((now, ms))

    def recent_ms(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()
        return self._recent[0][1] if self._recent else 0.0

    async def run(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(TICK_S)
            self.observe(time.monotonic() - start - TICK_S)
