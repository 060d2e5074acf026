"""The loop-lag figure: the worst stall over the last minute and since start, from the late
wake-ups of a sleeping task; a real stall on the loop shows in it."""

from __future__ import annotations

import asyncio
import time

import pytest

from agents.engine.looplag import TICK_S, WINDOW_S, LoopLag, run_queue_wait_s


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


def test_the_engine_s_own_share_is_the_stall_less_its_wait_for_a_cpu() -> None:
    lag = LoopLag()
    lag.observe(0.400, now=0.0, cpu_s=0.150, wait_s=0.380)  # the box's: 20 ms own
    lag.observe(0.090, now=1.0, cpu_s=0.120, wait_s=0.010)  # the engine's: 80 ms own
    assert (lag.worst_ms, lag.worst_cpu_ms, lag.worst_wait_ms) == (400.0, 150.0, 380.0)
    assert lag.worst_own_ms == pytest.approx(80.0) and lag.worst_own_cpu_ms == 120.0


def test_the_wait_for_a_cpu_is_read_where_linux_says_it() -> None:
    start = run_queue_wait_s()
    if start is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    assert start >= 0 and run_queue_wait_s() >= start  # type: ignore[operator]


async def test_a_stall_s_cpu_is_the_loop_thread_s() -> None:
    lag = LoopLag()
    task = asyncio.create_task(lag.run())
    try:
        await asyncio.sleep(TICK_S / 2)
        spent = time.thread_time()
        while time.thread_time() - spent < 0.3:  # the loop busy for 0.3 s of its own CPU
            pass
        deadline = time.monotonic() + 30
        while lag.worst_cpu_ms < 300 and time.monotonic() < deadline:
            await asyncio.sleep(TICK_S)
        assert lag.worst_cpu_ms >= 300
    finally:
        task.cancel()
