"""The event loop's stalls, measured as the engine runs: a task sleeps TICK_S and notes how
late it woke. A stall holds everything the engine does (dispatch, health checks, RPC replies,
the status push), so its worst is in every snapshot: over the last minute and since start.

On a shared box a stall may be no work of the engine's: its thread was ready and waited for a
CPU. Each tick also reads the loop thread's CPU time and its run-queue wait (Linux's
/proc/thread-self/schedstat), and the engine's own share of a stall is what is left of it
after that wait: the worst own share is the figure a target can be held to."""

from __future__ import annotations

import asyncio
import time
from collections import deque

TICK_S = 0.1
WINDOW_S = 60.0
SCHEDSTAT = "/proc/thread-self/schedstat"  # ns on a CPU, ns waiting for one, slices


def run_queue_wait_s() -> float | None:
    """The calling thread's time spent ready but waiting for a CPU since it started; None
    where the kernel does not say."""
    try:
        with open(SCHEDSTAT, "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class LoopLag:
    def __init__(self) -> None:
        self.worst_ms = 0.0
        # The worst stall's breakdown: the loop thread's CPU and its run-queue wait over that
        # tick (the sleep and the stall together: an upper bound on each in the stall).
        self.worst_cpu_ms = 0.0
        self.worst_wait_ms = 0.0
        # The worst stall less the run-queue wait in its tick: the engine's own.
        self.worst_own_ms = 0.0
        self.worst_own_cpu_ms = 0.0
        self._recent: deque[tuple[float, float]] = deque()  # (when, ms), worst kept first

    def observe(self, lag_s: float, now: float | None = None, cpu_s: float | None = None,
                wait_s: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        ms = max(0.0, lag_s * 1000)
        cpu_ms = 0.0 if cpu_s is None else cpu_s * 1000
        wait_ms = 0.0 if wait_s is None else wait_s * 1000
        if ms > self.worst_ms:
            self.worst_ms, self.worst_cpu_ms, self.worst_wait_ms = ms, cpu_ms, wait_ms
        own = max(0.0, ms - wait_ms)
        if own > self.worst_own_ms:
            self.worst_own_ms, self.worst_own_cpu_ms = own, cpu_ms
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
        wait = run_queue_wait_s()
        cpu = time.thread_time()
        while True:
            start = time.monotonic()
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            cpu_now, wait_now = time.thread_time(), run_queue_wait_s()
            self.observe(now - start - TICK_S, now, cpu_now - cpu,
                         None if wait is None or wait_now is None else wait_now - wait)
            cpu, wait = cpu_now, wait_now
