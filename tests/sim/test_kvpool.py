"""The simulated KV pool of `--max-total-tokens`: admission by KV room, retraction when a
decode step does not fit, the new-token ratio, the queue limit; in-process on a clock stepped
by hand (exact whatever the machine's load), and the log line in the real server's words."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agents.sim.config import SimConfig
from agents.sim.kvpool import INIT_RATIO, MIN_RATIO, KVPool
from agents.sim.model import OUT_OF_KV, QUEUE_FULL, SimModel, SimRequest
from tests.sim.realgoldens import load, template


def model_with(size: int, ready: bool = True, **kw: object) -> tuple[SimModel, list[float]]:
    now = [1000.0]
    cfg = SimConfig(time_scale=1.0, kv_limit=True, max_total_num_tokens=size,
                    answer_median=1e6, **kw)  # type: ignore[arg-type]
    model = SimModel(cfg, clock=lambda: now[0])
    if ready:
        model.set_ready()
    return model, now


def send(model: SimModel, rid: str, prompt: int, max_new: int) -> SimRequest:
    plan = model.plan_output(max_new, prompt, prompt=rid)  # runs to max_new (median 1e6)
    assert plan.n_tokens == max_new
    return model.submit(rid, plan, prompt, 0, False, max_new=max_new)


def run(model: SimModel, now: list[float], check: object = None, ticks: int = 20000) -> int:
    for i in range(ticks):
        if not model.running and not model.waiting:
            return i
        now[0] += 0.01
        model.tick(0.01)
        if callable(check):
            check()
    raise AssertionError("requests still running")


def test_admission_stops_where_the_kv_pool_is_reserved() -> None:
    model, now = model_with(1000, ready=False)
    reqs = [send(model, f"r{i}", 10, 200) for i in range(8)]
    model.set_ready()
    model.tick(0.001)
    # one round: each newcomer reserves prompt + a page + all its max_new, 211; 4 in 1,000
    assert len(model.running) == 4 and len(model.waiting) == 4
    assert [r.rid for r in model.waiting] == [r.rid for r in reqs[4:]]  # FIFO
    # refused once: none is tried again until a request leaves (SGLang's batch_is_full)
    now[0] += 0.001
    model.tick(0.001)
    assert len(model.running) == 4
    assert model.pool is not None and model.pool.blocked
    model.abort("r0")
    assert not model.pool.blocked
    # the next round counts the three left at what they hold plus 0.7 of what they may
    # still need (~150 each): two newcomers of 211 fit beside them, a third does not
    now[0] += 0.001
    model.tick(0.001)
    assert len(model.running) == 5 and len(model.waiting) == 2


def test_a_burst_queues_retracts_and_still_finishes_everything() -> None:
    """The recorder's small-KV burst: 16 requests on 3,072 tokens, a quarter of them short.
    The short ones end early, the ratio lets more in than will fit at full length, and the
    pool runs out: requests go back to the queue and finish later, each to its length."""
    model, now = model_with(3072)
    lines: list[str] = []
    model.log_event = lines.append
    reqs = [send(model, f"r{i}", 10, 32 if i % 4 == 0 else 256) for i in range(16)]
    peak = [0]

    def within() -> None:
        used = model.used_tokens()
        assert used <= 3072, used
        peak[0] = max(peak[0], used)

    run(model, now, within)
    assert all(r.finish == "length" and r.generated == r.max_new for r in reqs)
    retracted = [r for r in reqs if r.retractions]
    assert model.pool is not None and model.pool.retracted_reqs_total == sum(
        r.retractions for r in reqs) >= 1
    assert retracted and all(r.max_new == 256 for r in retracted)  # long ones, not the short
    assert peak[0] > 3072 * 0.9
    assert lines and all(line.startswith("KV cache pool is full. Retract requests. ")
                         for line in lines)
    assert model.pool.ratio == INIT_RATIO  # idle again: the ratio starts over


def test_the_retraction_line_is_the_real_servers() -> None:
    real = load("decode/small-kv_retract.log").splitlines()
    pool = KVPool(60)

    @dataclass
    class R:
        prompt_tokens: int
        generated: int
        max_new: int
        ignore_eos: bool = False

    # fewest generated goes first, then of those the longest prompt; one is always kept
    a, b, c = R(10, 40, 100), R(30, 5, 100), R(20, 5, 100)
    event = pool.step([a, b, c], 1)
    assert event is not None and event.victims == [b, c]
    assert event.gained == 35 + 25 and event.old_ratio == INIT_RATIO
    assert event.new_ratio == pytest.approx((40 + 20) / 101)
    assert {template(event.log_line())} == {template(line) for line in real}
    assert pool.retracted_reqs_total == 2 and pool.retracted_output_tokens_total == 10
    assert pool.step([a], 1) is None  # fits now: the ratio decays instead
    for _ in range(1000):
        pool.step([a], 1)
    assert pool.ratio == MIN_RATIO


def test_a_lone_request_too_big_for_the_pool_runs_then_is_aborted() -> None:
    model, now = model_with(100)
    req = send(model, "big", 10, 500)
    model.tick(0.001)
    assert model.running == [req]  # nothing else runs: the head goes in whatever it needs
    run(model, now)
    assert req.finish == "abort" and req.abort_message == OUT_OF_KV
    assert req.abort_status == 500 and req.generated >= 89


def test_ignore_eos_requests_are_reserved_in_full_and_never_retracted() -> None:
    model, now = model_with(3072)
    reqs = []
    for i in range(16):
        plan = model.plan_output(256, 10, ignore_eos=True)
        reqs.append(model.submit(f"e{i}", plan, 10, 0, False, max_new=256, ignore_eos=True))
    run(model, now)
    assert all(r.retractions == 0 and r.generated == 256 for r in reqs)


def test_a_full_queue_refuses_at_arrival() -> None:
    model, _ = model_with(100_000, max_running_requests=1, max_queued_requests=2)
    reqs = [send(model, "q0", 10, 200)]
    model.tick(0.001)  # q0 runs; then two may wait, and no more
    reqs += [send(model, f"q{i}", 10, 200) for i in range(1, 5)]
    assert [r.finish for r in reqs] == [None, None, None, "abort", "abort"]
    assert reqs[3].abort_status == 503 and reqs[3].abort_message == QUEUE_FULL
