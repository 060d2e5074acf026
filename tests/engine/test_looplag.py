"""The loop-lag figure: the worst stall over the last minute and since start, from the late
wake-ups of a sleeping task; a real stall on the loop shows in it."""

from __future__ import annotations

import asyncio
import time

from agents.engine.looplag import TICK_S, WINDOW_S, LoopLag


def test_the_worst_of_the_last_minute_and_of_all_time() -> None:
    lag = LoopLag()
    lag.observe(0.010, now=0.0)
    lag.observe(0.500, now=1.0)
    lag.observe(0.020, now=2.0)
    lag.observe(-0.001, now=3.0)  # early: no lag
    assert lag.recent_ms(now=3.0) == 500.0 and lag.worst_ms == 500.0
    assert lag.recent_ms(now=1.0 + WINDOW_S + 0.5) == 20.0  # the 500 ms stall aged out
    assert lag.recent_ms(now=10 * WINDOW_S) == 0.0 and lag.worst_ms == 500.0


async def test_a_stall_on_the_loop_is_seen() -> None:
    lag = LoopLag()
    task = asyncio.create_task(lag.run())
    try:
        await asyncio.sleep(TICK_S / 2)
        time.sleep(0.3)  # the loop held: the probe wakes at least 0.2 s late
        deadline = time.monotonic() + 30
        while lag.worst_ms < 150 and time.monotonic() < deadline:
            await asyncio.sleep(TICK_S)
        assert lag.worst_ms >= 150 and lag.recent_ms() >= 150
    finally:
        task.cancel()
