"""The ETA's p10-p90 band and what a run costs, on a frozen clock; both in a real
progress.json."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.engine.accounting import Meter, RateSpread, Totals
from agents.ewma import EwmaRate
from agents.rundir.schema import Progress, cost_of

T0 = 5000.0  # monotonic seconds at this engine's start


def progress(completed: int, total: int = 100_000, eta_hours: float | None = 1.0,
             output_tokens: int = 0) -> Progress:
    return Progress(total=total, completed=completed, failed=0, rate_per_sec=10.0,
                    eta_hours=eta_hours, total_input_tokens=0,
                    total_output_tokens=output_tokens, avg_output_tokens=0, elapsed_hours=0,
                    s3_uploaded=0, s3_bytes=0, status="running", truncated=0, empty=0,
                    max_tokens=4096, concurrency=8, in_flight=8, retried=0, s3_pending=0,
                    control_rev=1, updated_at=0, servers={})


def test_eta_band_from_the_spread_of_the_recent_rate() -> None:
    meter = Meter(Totals(), since_mono=T0)
    # Twenty minutes whose minutes alternate 8 and 12 completions a second.
    done, t = 0, T0
    p = meter.annotate(progress(done), now=t)
    assert p.eta_p10_hours is None and p.eta_p90_hours is None  # not enough spans yet
    for minute in range(20):
        rate = 8 if minute % 2 else 12
        for _ in range(60):
            t += 1
            done += rate
            p = meter.annotate(progress(done, eta_hours=None), now=t)
    remaining = 100_000 - done
    assert p.eta_p10_hours == pytest.approx(remaining / 12 / 3600, rel=0.02)
    assert p.eta_p90_hours == pytest.approx(remaining / 8 / 3600, rel=0.02)
    # The central ETA lies inside the band, which is widened to hold it if need be.
    central = remaining / 10 / 3600
    p = meter.annotate(progress(done, eta_hours=central), now=t + 1)
    assert p.eta_p10_hours is not None and p.eta_p90_hours is not None
    assert p.eta_p10_hours <= central <= p.eta_p90_hours
    far = meter.annotate(progress(done, eta_hours=central * 3), now=t + 2)
    assert far.eta_p90_hours == pytest.approx(central * 3, rel=1e-3)


def test_a_pause_makes_the_slow_end_unknown_and_the_end_is_zero() -> None:
    spread = RateSpread(window_s=600, bucket_s=60)
    meter = Meter(Totals(), spread=spread, since_mono=T0)
    done, t = 0, T0
    for minute in range(7):  # minutes 2 to 4 paused
        for _ in range(60):
            t += 1
            done += 0 if minute in (2, 3, 4) else 10
            meter.annotate(progress(done), now=t)
    p = meter.annotate(progress(done, eta_hours=None), now=t + 1)
    assert p.eta_p10_hours is not None and p.eta_p90_hours is None  # p10 of the rate is 0
    assert meter.annotate(progress(100_000, eta_hours=0.0), now=t + 2).eta_p90_hours == 0.0


def test_cost_so_far_per_million_tokens_and_projected() -> None:
    # 10 GPU-hours from earlier engines (recount.py), 8 GPUs for half an hour now.
    meter = Meter(Totals(gpu_hours=10.0), gpus=8, cost_per_gpu_hour=2.5, since_mono=T0)
    p = meter.annotate(progress(50_000, eta_hours=2.0, output_tokens=7_000_000),
                       now=T0 + 1800)
    assert (p.gpus, p.gpu_hours) == (8, 14.0)
    assert p.cost is not None
    assert p.cost.usd == 35.0  # 14 GPU-h x $2.50
    assert p.cost.per_mtok_usd == 5.0  # $35 / 7 M output tokens
    assert p.cost.projected_usd == 75.0  # + 8 GPUs x 2 h x $2.50
    # A node's own price in the fleet file: the console recomputes from the same figures.
    other = cost_of(4.0, p.gpus, p.gpu_hours, p.total_output_tokens, p.eta_hours)
    assert other is not None and (other.usd, other.projected_usd) == (56.0, 120.0)
    # Without a price: GPU-hours, no money.
    free = Meter(Totals(), gpus=8, since_mono=T0).annotate(progress(1), now=T0 + 3600)
    assert free.cost is None and free.gpu_hours == 8.0


def _with(p: Progress, **fields: Any) -> Progress:
    for k, v in fields.items():
        setattr(p, k, v)
    return p


def test_progress_json_carries_band_and_cost(tmp_path: Path, sims: Any) -> None:
    from tests.engine.runs import start_engine, write_prompts, write_spec

    sim = sims("--time-scale", "0.3")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 200)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], max_tokens=64)
    spec.write_text(spec.read_text().replace('name = "test-run"',
                                             'name = "test-run"\ncost_per_gpu_hour = 3.6'))
    engine = start_engine(spec)
    try:
        assert engine.wait(300) == 0, engine.stderr()
        p: dict[str, Any] = json.loads((engine.run_dir / "progress.json").read_text())
        assert p["status"] == "done" and p["gpus"] == 1 and p["gpu_hours"] > 0
        assert p["cost"]["per_gpu_hour"] == 3.6
        assert p["cost"]["usd"] == pytest.approx(3.6 * p["gpu_hours"], abs=0.01)
        assert p["cost"]["per_mtok_usd"] > 0
        assert p["eta_p10_hours"] == p["eta_p90_hours"] == 0.0
    finally:
        engine.kill()


def test_spec_keys_for_cost_idle_and_auto(tmp_path: Path) -> None:
    from agents.rundir.spec import SpecError, load_spec
    from tests.engine.runs import write_prompts, write_spec

    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 3)
    spec = write_spec(tmp_path / "run.toml", prompts, ["http://127.0.0.1:1"],
                      concurrency_per_server="auto")
    text = spec.read_text()
    loaded = load_spec(spec)
    assert loaded.generate is not None and loaded.generate.auto_concurrency
    assert loaded.generate.initial_concurrency == 4 and loaded.run.cost_per_gpu_hour is None
    assert loaded.alerts.idle_alert_s == 900.0
    for edit, where in (
            (('name = "test-run"', 'name = "test-run"\ncost_per_gpu_hour = -2.5'),
             "[run] cost_per_gpu_hour: must not be negative"),
            (('"auto"', '"fast"'), "[generate] concurrency_per_server"),
            (("[generate]", "[alerts]\nidle_alert_s = 0\n[generate]"),
             "[alerts] idle_alert_s: must be positive")):
        spec.write_text(text.replace(*edit))
        with pytest.raises(SpecError, match=re.escape(where)):
            load_spec(spec)


def test_a_rate_that_has_watched_little_is_the_mean_of_what_it_watched() -> None:
    # An engine's first tick comes milliseconds after its start, with nothing done: that
    # instant must not hold the rate near zero (a resumed run's ETA, the share a rebalance
    # gives it). Then 100 a second.
    r = EwmaRate(60.0, now=0.0)
    assert r.rate == 0.0 and r.tick(0.005) == 0.0
    t = 0.005
    for _ in range(3):
        r.add(100)
        t += 1.0
        r.tick(t)
    assert 99.0 < r.rate <= 100.0
    # Long watched, it still weighs the last tau most: ten a second for ten minutes, then
    # nothing for one tau leaves e^-1 of it.
    r = EwmaRate(60.0, now=0.0)
    for s in range(1, 601):
        r.add(10)
        r.tick(float(s))
    for s in range(601, 661):
        r.tick(float(s))
    assert r.rate == pytest.approx(10 * math.exp(-1), rel=1e-3)


def test_a_retry_line_supersedes_a_truncated_line_only_where_this_run_wrote_one() -> None:
    """On a campaign node the line a retry generation replaces may be another node's, or
    one of this node's that was not cut (a backup that lost its chunk's commit): `truncated`
    counts current lines here that are cut, never below zero, and carries across a restart
    in totals.json (its bits with it) to a recount of the lines after the record's point."""
    from agents.engine.recount import TotalsRecord, add_lines, record_of

    t = Totals()

    def line(index: int, finish: str, attempt: int = 1) -> None:
        t.add_line(10, 5, 0, finish, 64, attempt, False, index)

    line(3, "length")  # cut here, then redone here: superseded
    line(4, "stop")  # not cut here (a lost backup's line), redone here cut
    line(9, "length")  # cut here, not redone
    assert t.truncated == 2
    line(3, "stop", attempt=2)
    line(4, "length", attempt=2)
    line(700, "stop", attempt=2)  # another node's cut line redone here: nothing to take off
    line(701, "length", attempt=2)
    assert t.truncated == 3  # 4 (attempt 2), 9, 701
    # Another node's lines of a generation redone here, none of them this node's: never < 0.
    for i in range(1000, 1020):
        line(i, "stop", attempt=3)
    assert t.truncated == 3 and t.lines == 27
    # Through totals.json's record and a recount of lines after it: the same figures.
    rec = msgspec.json.decode(msgspec.json.encode(record_of(t, (0, 0), 0.0)), type=TotalsRecord)
    again = rec.totals()
    assert (again.truncated, again.cut) == (t.truncated, t.cut)
    raw = [msgspec.json.encode({"index": i, "finish_reason": f, "attempt": a, "max_tokens": 64,
                                "usage": {"prompt_tokens": 10, "completion_tokens": 5},
                                "content": "x"})
           for i, f, a in ((9, "stop", 2), (4, "stop", 3), (1000, "length", 4))]
    assert add_lines(again, [(Path("b"), k, r) for k, r in enumerate(raw)]) == 3
    assert again.truncated == 2  # 9 and 4 redone whole, 1000 cut at its fourth attempt


LOOPED = "Let me reconsider whether the diagonal is allowed here. " * 80
LONG = ("The proof proceeds by induction on n. For the base case the statement is immediate, "
        "since a single vertex has no edges and the bound holds trivially. Assume it for all "
        "graphs with fewer vertices; removing a vertex of minimum degree leaves a graph to which "
        "the hypothesis applies, and adding the vertex back costs at most its degree in colours, "
        "which by the choice of the vertex is bounded by the average degree of the original "
        "graph. It remains to check the case where every vertex has the same degree, in which")


def test_loops_among_the_truncated_are_counted_superseded_and_recounted_alike() -> None:
    """Live counting and a recount from the batch lines give the same split: a loop redone
    as a long answer leaves the loops, and the loop bits survive totals.json."""
    from agents.engine.recount import TotalsRecord, add_lines, record_of

    def raw(index: int, finish: str, text: str, attempt: int = 1, reasoning: bool = False
            ) -> bytes:
        return msgspec.json.encode({
            "index": index, "finish_reason": finish, "attempt": attempt, "max_tokens": 64,
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
            "content": None if reasoning else text,
            "reasoning_content": text if reasoning else "thinking"})

    lines = [raw(1, "length", LOOPED), raw(2, "length", LONG), raw(3, "stop", LOOPED),
             raw(4, "length", LOOPED, reasoning=True),  # cut looping in its thoughts
             raw(5, "length", LOOPED)]
    t = Totals()
    add_lines(t, [(Path("b"), k, r) for k, r in enumerate(lines)])
    assert (t.truncated, t.loops) == (4, 3)  # 1, 4, 5 loops; 2 long; 3 not cut
    assert [i for i in range(6) if t.is_looped(i)] == [1, 4, 5]
    rec = msgspec.json.decode(msgspec.json.encode(record_of(t, (0, 1), 0.0)), type=TotalsRecord)
    again = rec.totals()
    assert (again.loops, again.looped) == (t.loops, t.looped)
    later = [raw(1, "length", LONG, attempt=2),  # the loop redone, cut long this time
             raw(5, "stop", "done", attempt=2), raw(2, "length", LOOPED, attempt=2)]
    add_lines(again, [(Path("b"), k, r) for k, r in enumerate(later)])
    assert (again.truncated, again.loops) == (3, 2)  # 1 long; 2 and 4 loops; 5 done
    assert [i for i in range(6) if again.is_looped(i)] == [2, 4]
    whole = Totals()
    add_lines(whole, [(Path("b"), k, r) for k, r in enumerate(lines + later)])
    assert (whole.truncated, whole.loops, whole.looped) == (3, 2, again.looped)
