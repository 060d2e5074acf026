"""The simulated GPU: saturation, queueing, lengths, accept length and faults."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.sim.model import SimConfig, SimModel
from tests.servers.ports import wait_until
from tests.simserver import FAST_ARGS, SimHandle, start_sim, wait_exit

CHAT = {"messages": [{"role": "user", "content": "Write a poem."}]}


# ----- the model in-process -----

def test_throughput_curve_has_a_knee_and_a_best_concurrency() -> None:
    cfg = SimConfig()
    totals = {b: cfg.total_rate(b) for b in range(1, 129)}
    best = max(totals, key=lambda b: totals[b])
    assert best == cfg.best_concurrency == 40
    assert all(totals[b] < totals[b + 1] for b in range(1, best))
    assert totals[128] < totals[best]  # past the best, more requests only add latency
    # the knee: one more request early on adds far more than one more near the knee
    early = totals[2] - totals[1]
    at_knee = totals[int(cfg.knee) + 1] - totals[int(cfg.knee)]
    assert at_knee < early / 3
    assert cfg.per_request_rate(48) < cfg.per_request_rate(1) / 4


PROMPTS = [f"<|im_start|>user\nQuestion {i}: explain topic {i * 7919 % 1000}.<|im_end|>\n"
           for i in range(4000)]


def test_answer_lengths_match_the_reference_run_and_rise_with_the_limit() -> None:
    """Defaults: ~18% truncated at 4096 and ~1,814 tokens out on average, as in the reference
    run; at 8192 the same prompts are cut less often, and each gets its same answer longer."""
    model = SimModel(SimConfig(seed=3))
    at4k = [model.plan_output(4096, 50, prompt=p) for p in PROMPTS]
    at8k = [model.plan_output(8192, 50, prompt=p) for p in PROMPTS]
    share4 = sum(p.finish == "length" for p in at4k) / len(at4k)
    share8 = sum(p.finish == "length" for p in at8k) / len(at8k)
    assert share4 == pytest.approx(0.18, abs=0.02)
    assert sum(p.n_tokens for p in at4k) / len(at4k) == pytest.approx(1814, rel=0.05)
    assert share8 < share4 / 2
    for short, long in zip(at4k, at8k, strict=True):
        if short.finish == "stop":  # it ended by itself: the limit changed nothing
            assert replace(long, accept_length=short.accept_length) == short
        else:  # cut at 4096: the same answer (same text), longer or finished
            assert short.n_tokens == 4096 and long.n_tokens > 4096
            assert long.offset == short.offset and long.reasoning_len == short.reasoning_len
    assert all(p.n_tokens == 8192 for p in at8k if p.finish == "length")


def test_natural_length_is_the_prompts_own() -> None:
    a, b = SimModel(SimConfig(seed=5)), SimModel(SimConfig(seed=5))
    lengths = [a.planner.natural_length(p) for p in PROMPTS[:200]]
    assert lengths == [b.planner.natural_length(p) for p in reversed(PROMPTS[:200])][::-1]
    assert len(set(lengths)) > 150  # prompts differ
    other = SimModel(SimConfig(seed=6))
    assert lengths != [other.planner.natural_length(p) for p in PROMPTS[:200]]
    # the median flag moves every length by the same factor
    half = SimModel(SimConfig(seed=5, answer_median=675.0))
    assert [half.planner.natural_length(p) for p in PROMPTS[:20]] == pytest.approx(
        [n / 2 for n in lengths[:20]], abs=1)


def test_truncation_share_sets_the_share_past_4096() -> None:
    for share in (0.05, 0.3):
        model = SimModel(SimConfig(truncation_share=share, seed=3))
        plans = [model.plan_output(4096, 50, prompt=p) for p in PROMPTS]
        assert sum(p.finish == "length" for p in plans) / len(plans) == pytest.approx(
            share, abs=0.025)
        higher = [model.plan_output(16384, 50, prompt=p) for p in PROMPTS]
        assert sum(p.finish == "length" for p in higher) / len(higher) < share / 2
    # no max_tokens: bounded by the context only
    model = SimModel(SimConfig(context_length=2000))
    assert max(model.plan_output(None, 100, prompt=p).n_tokens for p in PROMPTS[:500]) <= 1900


def test_same_seed_same_outputs() -> None:
    a, b = SimModel(SimConfig(seed=7)), SimModel(SimConfig(seed=7))
    pa = [a.plan_output(500, 10) for _ in range(50)]
    assert pa == [b.plan_output(500, 10) for _ in range(50)]
    assert a.bank.pieces(pa[0], 0, pa[0].n_tokens) == b.bank.pieces(pa[0], 0, pa[0].n_tokens)
    other = SimModel(SimConfig(seed=8))
    assert pa != [other.plan_output(500, 10) for _ in range(50)]


def test_accept_length_and_verify_count() -> None:
    model = SimModel(SimConfig(accept_length=3.0))
    plans = [model.plan_output(800, 10) for _ in range(2000)]
    mean = sum(p.accept_length for p in plans) / len(plans)
    assert mean == pytest.approx(3.0, abs=0.05)
    assert all(1.0 <= p.accept_length <= 4.0 for p in plans)
    for p in plans[:100]:
        assert p.verify_ct(p.n_tokens) == math.ceil(p.n_tokens / p.accept_length)


def test_pieces_stream_to_the_whole_text() -> None:
    model = SimModel(SimConfig(seed=1))
    for _ in range(50):
        plan = model.plan_output(300, 10)
        whole = model.bank.pieces(plan, 0, plan.n_tokens)
        cuts = sorted({0, plan.n_tokens, *(model.rng.randrange(plan.n_tokens)
                                           for _ in range(5))})
        parts = [model.bank.pieces(plan, a, b) for a, b in itertools.pairwise(cuts)]
        assert "".join(p.raw for p in parts) == whole.raw
        assert "".join(p.reasoning for p in parts) == whole.reasoning
        assert "".join(p.content for p in parts) == whole.content
        assert whole.raw.startswith("<think>\n")
        if plan.finish == "stop":
            assert "\n</think>\n\n" in whole.raw and whole.content
        elif plan.n_tokens <= plan.reasoning_len + 1:
            assert whole.content == "" and "</think>" not in whole.raw


async def test_queue_forms_beyond_the_cap_and_throughput_saturates() -> None:
    # A fake clock stepped by hand: the counts are exact, whatever the machine's load.
    now = [1000.0]
    cfg = SimConfig(max_running_requests=8, time_scale=0.001, truncation_share=0.999)
    model = SimModel(cfg, clock=lambda: now[0])
    model.set_ready()
    plan = model.plan_output(10**9, 10)  # effectively endless
    reqs = [model.submit(f"r{i}", plan, 10, 0, False) for i in range(12)]

    def step(dt: float) -> None:
        now[0] += dt
        model.tick(dt)

    step(0.01)  # admitted, prefill done
    assert len(model.running) == 8 and len(model.waiting) == 4
    assert all(r.generated == 0 for r in reqs[8:])  # FIFO: the last four wait

    def rate() -> float:
        before = sum(r.generated for r in model.running)
        for _ in range(10):
            step(0.01)
        return (sum(r.generated for r in model.running) - before) / 0.1

    full = rate()
    model.abort(abort_all=True)
    one = model.submit("solo", plan, 10, 0, False)
    step(0.01)
    alone = rate()
    model.abort(one.rid)
    expected = cfg.total_rate(8) / cfg.total_rate(1)
    assert full / alone == pytest.approx(expected, rel=0.05)
    assert all(r.finish == "abort" for r in reqs)
    assert model.aborted_total == 13


def test_no_delay_answers_at_once() -> None:
    model = SimModel(SimConfig(time_scale=0))
    req = model.submit("x", model.plan_output(50, 5), 5, 0, False)
    assert req.done.is_set() and req.generated == req.plan.n_tokens
    assert model.finished_total == 1 and not model.running


def test_simulator_imports_stay_light() -> None:
    code = ("import sys, agents.sim.cli, agents.sim.server, agents.sim.model; "
            "print(sorted({'textual', 'asyncssh', 'torch'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


# ----- faults, in a real process -----

@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    handle = start_sim(tmp_path_factory.mktemp("faulty"), "--time-scale", "0.002",
                       "--load-seconds", "0", "--max-running-requests", "4")
    try:
        yield handle
    finally:
        handle.kill()


def set_faults(sim: SimHandle, **faults: Any) -> None:
    base = {"error_rate": 0, "error_status": 500, "hang_rate": 0, "garbage_rate": 0,
            "empty_rate": 0, "slow_factor": 1}
    resp = httpx.post(f"{sim.url}/sim/faults", json={**base, **faults})
    assert resp.status_code == 200, resp.text


def test_error_garbage_empty(faulty: SimHandle) -> None:
    url = faulty.url
    try:
        set_faults(faulty, error_rate=1)
        resp = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 10})
        assert resp.status_code == 500
        err = resp.json()
        assert err["object"] == "error" and err["code"] == 500 and err["message"]
        native = httpx.post(f"{url}/generate", json={"text": "x"})
        assert native.status_code == 500 and native.json()["error"]["message"]

        set_faults(faulty, error_rate=1, error_status=429)  # the status it is told
        resp = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 10})
        assert resp.status_code == 429 and resp.json()["code"] == 429

        set_faults(faulty, garbage_rate=1)
        resp = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 10})
        assert resp.status_code == 200
        with pytest.raises(ValueError):
            resp.json()

        set_faults(faulty, empty_rate=1)
        obj = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 50}).json()
        msg = obj["choices"][0]["message"]
        assert msg["content"] == "" and not msg["reasoning_content"] and not msg.get("tool_calls")
        assert obj["choices"][0]["finish_reason"] == "stop"

        set_faults(faulty, error_rate=0.5)
        with httpx.Client() as client:
            codes = [client.post(f"{url}/generate", json={"text": "x", "sampling_params": {
                "max_new_tokens": 2}}).status_code for _ in range(40)]
        assert 8 <= codes.count(500) <= 32 and codes.count(200) == 40 - codes.count(500)
    finally:
        set_faults(faulty)
    bad = httpx.post(f"{url}/sim/faults", json={"error_rate": 2})
    assert bad.status_code == 400 and "error_rate" in bad.json()["error"]
    assert httpx.post(f"{url}/sim/faults", json={"nope": 1}).status_code == 400
    bad = httpx.post(f"{url}/sim/faults", json={"error_status": 200})
    assert bad.status_code == 400 and "error_status" in bad.json()["error"]


def test_hang_is_counted_and_released_on_disconnect(faulty: SimHandle) -> None:
    try:
        set_faults(faulty, hang_rate=1)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{faulty.url}/v1/chat/completions", json={**CHAT, "max_tokens": 5},
                       timeout=httpx.Timeout(5, read=0.3))
    finally:
        set_faults(faulty)
    wait_until(lambda: httpx.get(f"{faulty.url}/sim/state").json()["in_flight"] == 0, 5,
               "hung request released after the client went away")


def test_slow_factor_slows_decoding(faulty: SimHandle) -> None:
    def speed() -> float:
        meta = httpx.post(f"{faulty.url}/generate", json={"input_ids": [1], "sampling_params": {
            "max_new_tokens": 1500, "ignore_eos": True}}).json()["meta_info"]
        return float(meta["completion_tokens"]) / meta["e2e_latency"]

    normal = max(speed() for _ in range(3))
    try:
        set_faults(faulty, slow_factor=5)
        slow = max(speed() for _ in range(3))
    finally:
        set_faults(faulty)
    assert normal / slow > 2.5


def test_queue_beyond_max_running_requests(faulty: SimHandle) -> None:
    url = faulty.url
    before = httpx.get(f"{url}/sim/state").json()
    results: list[int] = []

    def one() -> None:
        # ignore_eos: each answer runs to its max_tokens, so they outlast their arrivals
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                       json={**CHAT, "max_tokens": 30000, "ignore_eos": True})
        results.append(r.status_code)

    threads = [threading.Thread(target=one) for _ in range(10)]
    # Each answer lasts ~1.5 s: longer than ten threads take to start on a loaded machine.
    set_faults(faulty, slow_factor=5)
    try:
        for t in threads:
            t.start()
        seen: list[dict[str, Any]] = []

        def queued() -> bool:
            load = httpx.get(f"{url}/v1/loads", params={"include": "core"}).json()["loads"][0]
            seen.append(load)
            return load["num_waiting_reqs"] > 0

        wait_until(queued, 20, "a queue beyond --max-running-requests 4", interval=0.005)
        assert seen[-1]["num_running_reqs"] == 4
        for t in threads:
            t.join(60)
    finally:
        set_faults(faulty)
    assert results == [200] * 10
    state = httpx.get(f"{url}/sim/state").json()
    assert state["max_in_flight"] > 4
    assert state["max_tokens_counts"]["30000"] - before["max_tokens_counts"].get("30000", 0) == 10


def test_crash_after_requests(tmp_path: Path) -> None:
    sim = start_sim(tmp_path, *FAST_ARGS, "--crash-after-requests", "2")
    try:
        for _ in range(2):
            assert httpx.post(f"{sim.url}/generate", json={"text": "x"}).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{sim.url}/generate", json={"text": "x"})
        assert wait_exit(sim) == 1
        assert "Scheduler hit an exception" in sim.log_text()
    finally:
        sim.kill()


def test_crash_after_seconds_set_at_run_time(tmp_path: Path) -> None:
    sim = start_sim(tmp_path, "--time-scale", "0.01", "--load-seconds", "0")
    try:
        assert sim.alive()
        httpx.post(f"{sim.url}/sim/faults", json={"crash_after_seconds": 10})  # 0.1 s wall
        assert wait_exit(sim, timeout=10) == 1
    finally:
        sim.kill()
