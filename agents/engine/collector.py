"""The garbage collector paced by the engine's loop, so that no collection holds it long.

Python counts a collection's due by allocations less deallocations: at thousands of requests in
flight each answer frees about as many objects as the next request makes, so the count stays
low while the young generations fill with live request state (25,000 objects in the youngest,
80,000 in the middle one at 3,000 in flight; one pass over them held the loop 68-96 ms of
CPU, benchmarks/scale.py --trace-stalls). Here the young generations are collected on a clock
as well, so both stay small. A full collection passes over every request in flight and every
pooled connection (200,000 objects and 65-85 ms of CPU at 3,000 in flight; at the tail, with
under 100 requests left, the idle pools alone still cost 31-62 ms): none while the engine
runs, since its requests leave no cycles (tests/engine/test_collector.py holds it), except as
a valve when the resident set has grown well past the last one's (a cycle from elsewhere,
that outlived its young days, is freed only by a full collection).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("fleetdeck.engine")

YOUNG_S = 0.1  # the youngest generation collected at least this often
# Young collections between two middle ones (Python's default); full ones never by count,
# by `Collector` instead: when the resident set has grown FULL_GROWTH times since the last
# full one (or the start), and by at least FULL_GROWTH_MIN.
MIDDLE_EVERY = 10
FULL_BY_COUNT = 1_000_000_000
FULL_GROWTH = 2.0
FULL_GROWTH_MIN = 256 * 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")


def settle_heap() -> None:
    """What the start made (the offset index, the done-set, modules) frozen out of the
    collector's sight, and full collections never by count: `Collector` paces them."""
    gc.collect()
    gc.freeze()
    first, _, _ = gc.get_threshold()
    gc.set_threshold(first, MIDDLE_EVERY, FULL_BY_COUNT)


def resident_bytes() -> int:
    """This process's resident set (one small read of /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


class Collector:
    """Young collections on a clock; a full one only when memory grew (see the module)."""

    def __init__(self, live: Callable[[], int], growth_min: int = FULL_GROWTH_MIN,
                 growth: float = FULL_GROWTH) -> None:
        self.live = live  # requests in flight now (what a full collection's pass is over)
        self.growth_min = growth_min
        self.growth = growth
        self.full_collections = 0
        self.worst_full_ms = 0.0
        self.worst_full_cpu_ms = 0.0
        self._rss_after_full = resident_bytes()

    def full(self, why: str) -> None:
        t, cpu = time.perf_counter(), time.thread_time()
        found = gc.collect()
        ms = (time.perf_counter() - t) * 1000
        cpu_ms = (time.thread_time() - cpu) * 1000
        self.full_collections += 1
        self.worst_full_ms = max(self.worst_full_ms, ms)
        self.worst_full_cpu_ms = max(self.worst_full_cpu_ms, cpu_ms)
        self._rss_after_full = resident_bytes()
        log.info("full garbage collection (%s): %d unreachable objects, %.1f ms, %.1f ms of "
                 "CPU", why, found, ms, cpu_ms)

    def grown(self) -> bool:
        """The resident set past `growth` x (and `growth_min` over) the last full
        collection's: garbage in cycles may be what grew."""
        rss = resident_bytes()
        return rss > max(self._rss_after_full * self.growth,
                         self._rss_after_full + self.growth_min)

    async def run(self) -> None:
        self._rss_after_full = resident_bytes()  # the run starts with what prepare() made
        ticks = 0
        while True:
            await asyncio.sleep(YOUNG_S)
            ticks += 1
            # The middle one explicitly: by count it comes only after the youngest's count
            # is due, which the clock's collections keep it from.
            gc.collect(0 if ticks % MIDDLE_EVERY else 1)
            if ticks % MIDDLE_EVERY == 0 and self.grown():
                self.full(f"resident set {resident_bytes() / 2**20:.0f} MiB, "
                          f"{self._rss_after_full / 2**20:.0f} MiB after the last, "
                          f"{self.live()} requests in flight")
