"""The engine's paced garbage collector: the young generation is collected on a clock (no pass
over a bloated young heap); a run's requests leave no cycles, so no full collection is needed
while it runs, and cycles from elsewhere that died old are freed by one when the resident set
has grown: memory does not grow unbounded."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.engine.collector import YOUNG_S, Collector, resident_bytes, settle_heap
from agents.engine.progress import progress_of
from agents.engine.run import Engine, event_loop_runner
from agents.rundir.spec import load_spec
from tests.engine.runs import write_prompts, write_spec


class Node:
    """A cycle (self-referencing) holding a payload."""

    def __init__(self, payload: int) -> None:
        self.me = self
        self.payload = bytearray(payload)


@pytest.fixture
def gc_settings() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def old_cycles(n: int, payload: int) -> list[weakref.ref[Node]]:
    """`n` cycles aged into the oldest generation, then dropped: only a full collection
    frees them."""
    nodes = [Node(payload) for _ in range(n)]
    gc.collect(1)  # survivors of the middle generation go to the oldest
    refs = [weakref.ref(x) for x in nodes]
    del nodes
    gc.collect(1)
    assert all(r() is not None for r in refs), "young collections must not reach them"
    return refs


async def wait_freed(refs: list[weakref.ref[Node]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while any(r() is not None for r in refs):
        assert time.monotonic() < deadline, (
            f"{sum(r() is not None for r in refs)} of {len(refs)} old cycles still alive")
        await asyncio.sleep(YOUNG_S)


async def test_young_objects_are_collected_on_the_clock(gc_settings: None) -> None:
    settle_heap()
    # At thousands of requests in flight each answer frees about as many objects as the next
    # request makes, and Python's count (allocations less deallocations) never comes due:
    # here it cannot.
    gc.set_threshold(10**9, 10, 10**9)
    # However few requests are in flight, no full collection while memory is flat: a pass
    # over the idle connection pools alone cost 31-62 ms of CPU at the tail of a run at 3,000.
    collector = Collector(lambda: 0)
    task = asyncio.create_task(collector.run())
    try:
        refs = []
        for _ in range(2000):
            node = Node(16)
            refs.append(weakref.ref(node))
            del node
        assert gc.get_count()[0] >= 2000 and all(r() is not None for r in refs)
        await wait_freed(refs, timeout=30)
        assert collector.full_collections == 0
    finally:
        task.cancel()


async def test_old_cycles_are_freed_when_memory_grows(gc_settings: None) -> None:
    settle_heap()
    # Growth by bytes alone: "doubled" depends on what this worker process held before (a
    # file of trainer tests in it left ~500 MiB, and 100 MiB more doubled nothing: ci10).
    collector = Collector(lambda: 10_000, growth_min=64 * 2**20, growth=1.0)
    task = asyncio.create_task(collector.run())
    await asyncio.sleep(0)  # its start: the resident set it measures growth from
    try:
        # Cycles, dead but not freed, until the resident set has grown 64 MiB: memory this
        # worker freed before is reused first, so a fixed 100 MiB grew it by 36 (ci11).
        before = resident_bytes()
        refs: list[weakref.ref[Node]] = []
        while resident_bytes() <= before + 64 * 2**20:
            assert len(refs) < 2048, "2 GiB in cycles and the resident set did not grow"
            refs += old_cycles(16, 2**20)
        await wait_freed(refs)
        assert collector.full_collections >= 1
    finally:
        task.cancel()


# -- no cycles to collect: what the engine's requests leave behind is freed by refcount ---------

SCALE = 0.02  # wall seconds per simulated second


def test_a_run_with_hedges_and_deadline_misses_leaves_no_cycles(
        tmp_path: Path, sims, monkeypatch: pytest.MonkeyPatch) -> None:
    """No full collection runs while the engine runs (a pass over its requests and pools
    would hold the loop): cycles its requests made would pile up (at 10,000 in flight, with
    full collections deferred to the tail, 223,070 objects and a 2.1 s collection, from the
    copies hedges and deadlines ended: the task kept its exception, whose
    traceback held a frame that held the task). The engine runs here on its own loop (uvloop)
    with the collector off: every object its requests made must be freed by reference
    counting alone. (asyncio's own loop leaves a cycle per closed connection, its transport's
    bound read callback: not the engine's loop, and per connection, not per request.)"""
    servers = [sims("--time-scale", SCALE, "--seed", 0, "--hang-rate", "0.02"),
               sims("--time-scale", SCALE, "--seed", 1, "--slow-factor", "6"),
               sims("--time-scale", SCALE, "--seed", 2, "--hang-rate", "0.02",
                    "--error-rate", "0.1")]
    n = 400
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, n)
    spec = write_spec(tmp_path / "run.toml", prompts, [s.url for s in servers],
                      max_tokens=512, concurrency_per_server=16,
                      request_timeout_s=3600 * SCALE, min_deadline_s=0.5)
    engine = Engine(load_spec(spec))

    async def off() -> None:  # not even young collections: they would free young cycles
        await asyncio.Event().wait()

    monkeypatch.setattr(engine.collector, "run", off)
    log = logging.getLogger("fleetdeck")
    handlers = list(log.handlers)
    try:
        engine.prepare()
        gc.collect()
        gc.disable()
        try:
            assert event_loop_runner()(engine.run(install_signals=False)) == 0
            p = progress_of(engine)
            del engine  # its requests' state: freed now, or garbage below
            gc.set_debug(gc.DEBUG_SAVEALL)
            found = gc.collect()
            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    finally:
        for h in set(log.handlers) - set(handlers):
            log.removeHandler(h)
            h.close()
    assert p.completed + p.failed == n
    # The paths that made cycles were taken: hedges (the losers cancelled), deadlines missed,
    # errors retried.
    assert p.hedges >= 1 and p.deadline_misses >= 1 and p.retried >= 1, p
    assert found <= 20, f"{found} objects in cycles after {n} requests: {kinds.most_common(12)}"
