"""The tail: request deadlines from the servers' own pace, SGLang's /abort_request, and
hedging when the work left is under the capacity in flight. Real simulators, the real engine
as a process, kill -9 at crash points inside a hedge."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from agents.engine.client import (
    Aborted,
    RequestFailed,
    abort,
    build_request,
    make_client,
    parse_response,
    rid_for,
)
from agents.engine.deadlines import (
    ABORT_CONFIRM_S,
    MIN_ANSWERS,
    PRUNE_MIN,
    WAKE_SLICE,
    Deadline,
    DeadlineMiss,
    Pace,
    Peak,
    send_within,
)
from agents.engine.prompts import Prompt
from agents.engine.serverload import ServerLoad
from agents.rundir.spec import SpecError, load_spec
from tests.engine.runs import (
    EngineProc,
    read_run,
    start_engine,
    wait_progress,
    write_prompts,
    write_spec,
)
from tests.servers.ports import wait_until

SCALE = 0.1  # wall seconds per simulated second in these runs
TODAY_TIMEOUT_S = 3600 * SCALE  # request_timeout_s's default, in this time scale


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "failures.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _state(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/sim/state", timeout=60).json())


# -- the pace and its deadline ---------------------------------------------------------------

def test_deadline_comes_from_the_servers_pace_and_stays_in_its_bounds() -> None:
    pace = Pace(factor=3.0, min_s=5.0, max_s=600.0)
    assert pace.deadline(0, 1000) is None  # nothing known: request_timeout_s holds
    pace.observe_figures(0, gen_throughput=2000.0, running=20)  # SGLang: 100 tok/s a request
    d = pace.deadline(0, 1000)
    assert d is not None and d.seconds == pytest.approx(30.0)
    for _ in range(4):  # its own answers win over the metrics: 300 tokens in 6 s = 50 tok/s
        pace.observe(0, 300, 6.0)
    d = pace.deadline(0, 1000)
    assert d is not None and d.seconds == pytest.approx(60.0) and d.tokens_per_s == 50.0
    # a server that never answered takes the fleet's pace
    d1 = pace.deadline(1, 1000)
    assert d1 is not None and d1.seconds == pytest.approx(60.0)
    # clamped: never under min_deadline_s, never over request_timeout_s
    small, big = pace.deadline(0, 10), pace.deadline(0, 10**6)
    assert small is not None and small.seconds == 5.0
    assert big is not None and big.seconds == 600.0
    assert Pace(factor=0.0, min_s=5.0, max_s=600.0).deadline(0, 1000) is None  # off
    assert pace.median_latency() == 6.0


@pytest.mark.parametrize(("key", "value", "why"), [
    ("deadline_factor", 0.5, "must be 0 (off) or at least 1"),
    ("min_deadline_s", 0, "must be positive"),
    ("min_deadline_s", 99.0, "at most request_timeout_s"),
])
def test_bad_deadline_keys_are_named(tmp_path: Path, key: str, value: float, why: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 3)
    spec = write_spec(tmp_path / "run.toml", prompts, ["http://127.0.0.1:1"],
                      **{key: value})
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert f"[generate] {key}" in str(err.value) and why in str(err.value)


# -- SGLang's /abort_request, as the simulator serves it --------------------------------------

async def test_abort_request_by_rid_with_the_admin_key(sims) -> None:
    """SGLang's interface: POST /abort_request {"rid": ...}; ADMIN_OPTIONAL auth (the admin
    key when the server has one, the API key then refused); a rid still held is refused as a
    duplicate; the aborted request answers with finish_reason "abort"."""
    sim = sims("--api-key", "sk-1", "--admin-api-key", "adm", "--hang-rate", "1")
    prompt = Prompt(index=7, id=None, messages=[{"role": "user", "content": "hi"}], tools=None)
    rid = rid_for(7, 2, 1, "e0")
    body = build_request(prompt, "default", 64, {}, {}, rid=rid)
    assert body["rid"] == "7:2:1:e0"
    client = make_client(sim.url, 4, 2.0, 30.0, "sk-1")
    try:
        sent = msgspec.json.encode(body)
        held = asyncio.ensure_future(client.request("POST", "/v1/chat/completions", sent))
        await asyncio.to_thread(wait_until, lambda: _state(sim.url)["hung"] == 1, 120,
                                "the request held by the simulator")
        dup_status, dup_body = await client.request("POST", "/v1/chat/completions", sent)
        with pytest.raises(RequestFailed) as err:
            parse_response(dup_status, dup_body, 0.0)
        assert dup_status == 400 and err.value.retryable  # later, not never
        assert await abort(client, rid, None) == 401  # the API key is not the admin key
        assert _state(sim.url)["hung"] == 1
        assert await abort(client, rid, "adm") == 200
        status, answer = await asyncio.wait_for(held, 120)
        with pytest.raises(Aborted):
            parse_response(status, answer, 0.0)
        state = _state(sim.url)
        assert state["hung"] == 0 and state["aborted_total"] == 1
        assert await abort(client, "no-such-rid", "adm") == 200  # as SGLang: a no-op
        bad, _ = await client.request("POST", "/abort_request", b"[1, 2",
                                      {"Authorization": "Bearer adm",
                                       "Content-Type": "application/json"})
        assert bad == 400
    finally:
        await client.aclose()


# -- deadlines ---------------------------------------------------------------------------------

def test_an_aborted_copys_pace_joins_its_servers() -> None:
    """Copies given up together when the server slowed for all of them: their confirmed
    tokens make the pace their retries meet, not the pace from before the slowdown."""
    pace = Pace(factor=3.0, min_s=1.0, max_s=600.0)
    for _ in range(4):
        pace.observe(0, 100, 1.0)
    assert pace.tokens_per_s(0) == 100.0
    for _ in range(8):
        pace.observe_aborted(0, 30, 3.0)  # 10 tokens/s: the server is ten times slower now
    assert pace.tokens_per_s(0) == pytest.approx((400 + 240) / (4 + 24))
    pace.observe_aborted(0, 0, 3.0)  # queued, nothing made: no pace
    assert pace.tokens_per_s(0) == pytest.approx((400 + 240) / (4 + 24))
    assert pace.median_latency() == 1.0  # answers only


async def test_a_copys_deadline_only_grows_and_the_server_confirms_its_abort(sims) -> None:
    """The pace rises while a copy runs (the answers of a shrinking batch): the deadline the
    copy started with stands. At it, /abort_request, and the server's own answer to the
    aborted request (finish_reason abort) confirms the miss; an abort the server refused is
    not waited for."""
    sim = sims("--hang-rate", "1")
    client = make_client(sim.url, 4, 2.0, 30.0, None)
    prompt = Prompt(index=1, id=None, messages=[{"role": "user", "content": "hi"}], tools=None)
    try:
        rid = rid_for(1, 1, 1, "e0")
        body = build_request(prompt, "default", 64, {}, {}, rid=rid)
        asked = iter([Deadline(1.0, 192.0, 64)])

        def deadline() -> Deadline:  # then ten times faster: 0.1 s
            return next(asked, Deadline(0.1, 1920.0, 64))

        async def abort_it() -> bool:
            return await abort(client, rid, None) == 200

        start = time.monotonic()
        with pytest.raises(DeadlineMiss) as miss:
            await send_within(client, body, deadline, 3.0, abort_it)
        assert 1.0 <= miss.value.elapsed_s < 1.0 + ABORT_CONFIRM_S
        assert miss.value.confirmed and miss.value.tokens is not None
        assert "aborted on the server after" in miss.value.message
        assert _state(sim.url)["aborted_total"] == 1

        async def refused() -> bool:
            return False

        rid2 = rid_for(1, 1, 2, "e0")
        start = time.monotonic()
        with pytest.raises(DeadlineMiss) as miss:
            await send_within(client, {**body, "rid": rid2}, lambda: Deadline(0.3, 640.0, 64),
                              3.0, refused)
        # Not waited for: a wait would have taken the deadline and ABORT_CONFIRM_S more.
        assert not miss.value.confirmed and time.monotonic() - start < 0.3 + ABORT_CONFIRM_S
        assert "did not confirm the abort" in miss.value.message
        # The HTTP request was closed on the way out: the server lets it go by itself.
        await asyncio.to_thread(wait_until, lambda: _state(sim.url)["hung"] == 0, 120,
                                "the unconfirmed copy released on its closed connection")
    finally:
        await client.aclose()


async def test_a_copy_wakes_at_its_deadline_or_at_a_new_pace_not_on_a_poll(sims) -> None:
    """A copy with no deadline yet sleeps until the pace may have changed (no poll), then asks
    on its timer, and is given up at its deadline."""
    sim = sims("--hang-rate", "1")
    client = make_client(sim.url, 4, 2.0, 30.0, None)
    prompt = Prompt(index=1, id=None, messages=[{"role": "user", "content": "hi"}], tools=None)
    pace = Pace(3.0, 0.1, 600.0)
    asks: list[float] = []

    def deadline() -> Deadline | None:
        asks.append(time.monotonic())
        return pace.deadline(0, 64)

    async def refused() -> bool:
        return False

    try:
        body = build_request(prompt, "default", 64, {}, {}, rid=rid_for(1, 1, 1, "e0"))
        copy = asyncio.ensure_future(send_within(client, body, deadline, 3.0, refused,
                                                 pace.changed))
        await asyncio.to_thread(wait_until, lambda: _state(sim.url)["hung"] == 1, 120,
                                "the copy held by the simulator")
        await asyncio.sleep(0)
        assert len(asks) == 1 and not copy.done()  # no pace: asleep until one comes
        for _ in range(MIN_ANSWERS):  # 64 tokens in 8/3 s each: a 3 x 8/3 = 8 s deadline
            pace.observe(0, 64, 8 / 3)
        with pytest.raises(DeadlineMiss):
            await asyncio.wait_for(copy, 120)
        # Then asked on its timer until the deadline came, and given up at it, not before.
        assert len(asks) > 2 and asks[-1] - asks[0] >= 8.0 - 0.05
    finally:
        await client.aclose()


@pytest.mark.parametrize("retries", [1, 3])
def test_a_server_that_hangs_misses_deadlines_is_set_aside_and_its_work_goes_on(
        tmp_path: Path, sims, retries: int) -> None:
    good = sims("--time-scale", str(SCALE), "--seed", 0)
    hung = sims("--time-scale", str(SCALE), "--seed", 1, "--hang-rate", "1")
    n = 80
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, n)
    spec = write_spec(tmp_path / "run.toml", prompts, [good.url, hung.url], max_tokens=512,
                      concurrency_per_server=4, retries=retries,
                      request_timeout_s=TODAY_TIMEOUT_S, min_deadline_s=0.2, hedge=False)
    engine = start_engine(spec)
    try:
        seen = wait_progress(engine, lambda p: p["servers"]["1"]["state"] == "down", 120,
                             "the hanging server set aside")
        assert "deadline" in (seen["servers"]["1"]["last_error"] or "")
        assert engine.wait(300) == 0, engine.stderr()
    finally:
        engine.kill()
    st = read_run(engine.run_dir)
    assert st.todo == set() and len(st.current) + len(st.failed) == n
    assert all(line["server"] == 0 for line in st.current.values())
    events = _events(engine.run_dir)
    failed = [e for e in events if e["event"] == "failed"]
    requeued = [e for e in events if e["event"] == "requeued"]
    assert {e["error"] for e in failed} <= {"deadline"}
    if retries == 1:  # no second try: given up at the first deadline
        assert failed and not requeued and {e["index"] for e in failed} == st.failed
    else:  # the second try goes to the other server
        assert not failed and len(st.current) == n
        assert requeued and {e["what"] for e in requeued} == {"deadline"}
        assert all(e["attempt"] == 1 for e in requeued)
        # each names the server and the miss, for the failures view
        assert all(e["server"] == 1 and e["message"] for e in requeued), requeued
    progress = json.loads((engine.run_dir / "progress.json").read_text())
    assert progress["deadline_misses"] >= len(failed) + len(requeued) > 0
    assert progress["aborts_confirmed"] == progress["deadline_misses"]
    # each miss was aborted on the server through /abort_request, nothing is left held
    state = _state(hung.url)
    assert state["abort_requests"] >= progress["deadline_misses"]
    wait_until(lambda: _state(hung.url)["hung"] == 0, 120, "held requests released")


# -- the tail: hangs and a slow server -------------------------------------------------------

def _watch_tail(engine: EngineProc, n: int) -> dict[str, Any]:
    """Poll progress.json: when 99% and 100% of the indices were settled, whether the run
    said "tail", and the last progress."""
    seen: dict[str, Any] = {"t99": None, "t100": None, "tail": False}

    def check() -> bool:
        p = engine.progress()
        if p is None:
            return False
        now = time.monotonic()
        settled = p["completed"] + p["failed"]
        seen["tail"] = seen["tail"] or p.get("tail", False)
        if seen["t99"] is None and settled >= math.ceil(0.99 * n):
            seen["t99"] = now
        if settled >= n:
            seen["t100"] = now
            seen["last"] = p
            return True
        return False

    wait_until(check, 300, "every index settled", interval=0.01)
    return seen


def test_hangs_and_a_slow_server_end_within_three_median_latencies(tmp_path: Path,
                                                                   sims) -> None:
    """Today a hung request holds the run for request_timeout_s (here 3,600 simulated s):
    with deadlines and hedging, the last 1% takes at most 3x the median request latency."""
    servers = [sims("--time-scale", str(SCALE), "--seed", 0, "--hang-rate", "0.02"),
               sims("--time-scale", str(SCALE), "--seed", 1, "--slow-factor", "6"),
               sims("--time-scale", str(SCALE), "--seed", 2, "--hang-rate", "0.02")]
    n = 400
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, n)
    spec = write_spec(tmp_path / "run.toml", prompts, [s.url for s in servers],
                      max_tokens=1024, concurrency_per_server=8,
                      request_timeout_s=TODAY_TIMEOUT_S, min_deadline_s=0.5)
    engine = start_engine(spec, env={"FLEETDECK_PROGRESS_INTERVAL_S": "0.02"})
    try:
        seen = _watch_tail(engine, n)
        assert engine.wait(300) == 0, engine.stderr()
    finally:
        engine.kill()
    st = read_run(engine.run_dir)  # one line per (index, attempt), done-set agrees
    assert st.todo == set() and len(st.current) + len(st.failed) == n
    failed = [e for e in _events(engine.run_dir) if e["event"] == "failed"]
    assert {e["error"] for e in failed} <= {"deadline"}, failed[:3]
    median_sim = statistics.median(line["latency_s"] for line in st.current.values()) / SCALE
    tail_sim = (seen["t100"] - seen["t99"]) / SCALE
    assert tail_sim <= 3 * median_sim, (
        f"99% -> 100% took {tail_sim:.1f} simulated s, median latency {median_sim:.1f} s")
    last = seen["last"]
    assert seen["tail"] and last["hedges"] >= 1 and last["deadline_misses"] >= 1
    # the slow server's last requests were answered elsewhere: some hedges won
    assert last["hedges_won"] >= 1
    assert sum(_state(s.url)["abort_requests"] for s in servers) >= 1


# -- hedge + kill -9 + resume ------------------------------------------------------------------

@pytest.mark.parametrize("point", ["hedge_sent:1", "hedge_won:1"])
def test_kill_9_in_the_middle_of_a_hedge_then_resume_keeps_one_line_per_attempt(
        tmp_path: Path, sims, point: str) -> None:
    servers = [sims("--time-scale", str(SCALE), "--seed", 0),
               sims("--time-scale", str(SCALE), "--seed", 1, "--slow-factor", "8"),
               sims("--time-scale", str(SCALE), "--seed", 2, "--hang-rate", "0.03")]
    n = 150
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, n)
    # Deadlines off: on a loaded machine they fired first, set the slow server aside and
    # left no request old enough to hedge, so the crash point was never reached.
    spec = write_spec(tmp_path / "run.toml", prompts, [s.url for s in servers],
                      max_tokens=512, concurrency_per_server=4, batch_size=40,
                      request_timeout_s=TODAY_TIMEOUT_S, deadline_factor=0)
    crashed = start_engine(spec, env={"FLEETDECK_CRASH_AT": point})
    assert crashed.wait(300) == -signal.SIGKILL, crashed.stderr()
    before = read_run(crashed.run_dir, after_kill=True)
    assert "hedged on server" in (crashed.run_dir / "logs" / "generate.log").read_text()
    resumed = start_engine(spec)
    assert resumed.wait(300) == 0, resumed.stderr()
    st = read_run(resumed.run_dir)  # asserts no (index, attempt) written twice
    assert st.todo == set() and len(st.current) + len(st.failed) == n
    assert set(before.current) <= set(st.current)
    assert st.lines == len(st.current)  # attempt 1 only: exactly one line per index
    progress = json.loads((resumed.run_dir / "progress.json").read_text())
    assert progress["completed"] == len(st.current) and progress["status"] == "done"


def test_a_peak_answers_the_highest_value_since_any_moment() -> None:
    peak = Peak()
    assert peak.since(0.0) is None
    for at, value in [(1.0, 5.0), (2.0, 3.0), (3.0, 4.0), (4.0, 1.0), (5.0, 2.0)]:
        peak.add(at, value)
    assert [peak.since(t) for t in (0.5, 1.0, 2.5, 3.0, 4.5, 5.0)] == [5.0, 4.0, 4.0, 2.0, 2.0,
                                                                      None]
    peak.forget(2.5)  # older than that: gone
    assert peak.since(0.0) == 4.0
    for i in range(100_000):  # 1,000 falling values a second for 100 s: ~100 kept a second
        peak.add(10.0 + i * 0.001, 1.0 - i * 1e-6)
    assert len(peak._values) - peak._head <= 100 * 100 + 5
    # Never lower than the truth (the highest after 50 s), and at most 10 ms of values above.
    assert 1.0 - 40_000e-6 <= peak.since(50.0) <= 1.0 - 39_990e-6 + 1e-9


async def test_copies_waiting_for_a_pace_wake_once_it_is_known_a_slice_a_loop_turn() -> None:
    """10,000 copies sent before any answer all wait for a pace: answers that leave it
    unknown wake none (each woke them all, to wait again), and the one that makes it known
    wakes them WAKE_SLICE a loop turn, so that a turn stays short (arming them all in one
    turn held the engine's loop ~100 ms: benchmarks/scale.py)."""
    pace = Pace(factor=3.0, min_s=1.0, max_s=600.0)
    woken_in_turn: list[int] = []
    turn = [0]

    def armed(_: asyncio.Future[None]) -> None:  # what a copy's watch does when woken
        woken_in_turn.append(turn[0])
        assert pace.deadline(0, 100) is not None

    waiting = [pace.changed() for _ in range(10_000)]
    for fut in waiting:
        fut.add_done_callback(armed)
    for _ in range(MIN_ANSWERS - 1):
        pace.observe(0, 100, 1.0)
    await asyncio.sleep(0)
    assert not any(f.done() for f in waiting) and pace.deadline(0, 100) is None
    pace.observe(0, 100, 1.0)  # the fourth: the pace is known
    while len(woken_in_turn) < len(waiting):
        turn[0] += 1
        await asyncio.sleep(0)
        assert turn[0] < 1000, f"{len(woken_in_turn)} of {len(waiting)} woken"
    per_turn = [woken_in_turn.count(t) for t in set(woken_in_turn)]
    assert max(per_turn) <= WAKE_SLICE and len(per_turn) >= len(waiting) // WAKE_SLICE
    late = pace.changed()
    pace.observe(0, 100, 1.0)  # nothing new: a waiter now stays
    await asyncio.sleep(0)
    assert not late.done()


async def test_a_copy_that_ends_while_no_pace_is_known_is_not_kept() -> None:
    """While no answer brings a pace (every one without tokens), copies come and go: those
    that ended must not pile up in the pace's waiting list (one per request of the run)."""
    pace = Pace(factor=3.0, min_s=1.0, max_s=600.0)
    for _ in range(20 * PRUNE_MIN):
        pace.changed().cancel()  # what a copy's watch does with its wait when the copy ends
        pace.observe(0, 0, 1.0)
    live = [pace.changed() for _ in range(10)]
    assert len(pace._waiters) <= 2 * PRUNE_MIN
    for _ in range(MIN_ANSWERS):
        pace.observe(0, 100, 1.0)
    await asyncio.sleep(0)
    assert all(f.done() and not f.cancelled() for f in live)


def test_a_copy_keeps_the_queue_it_waited_in_after_the_queue_is_gone() -> None:
    """Asked only when its deadline comes, a copy's deadline is still the longest it had
    since it was sent: a server's queue that came and went, a slower pace (the real server
    short of KV room: tests/real/test_kv_pressure.py). A copy sent after it does not get it."""
    pace = Pace(factor=3.0, min_s=1.0, max_s=600.0)
    for _ in range(MIN_ANSWERS):
        pace.observe(0, 100, 1.0)  # 100 tokens/s a request: 3 x 100 tokens = 3 s
    sent = time.monotonic()
    d = pace.longest(0, 100, sent)
    assert d is not None and d.seconds == pytest.approx(3.0)
    pace.observe_load(0, ServerLoad(running=10, queued=40, retracted=0))  # 4 turns of waiting
    pace.observe_load(0, ServerLoad(running=10, queued=0, retracted=0))
    d = pace.longest(0, 100, sent)
    assert d is not None and d.seconds == pytest.approx(15.0)
    assert "since it was sent" in d.why(3.0)
    now = pace.deadline(0, 100, sent)  # by the queue of the moment: gone
    assert now is not None and now.seconds == pytest.approx(3.0)
    later = time.monotonic() + 1e-3
    d = pace.longest(0, 100, later)
    assert d is not None and d.seconds == pytest.approx(3.0)
