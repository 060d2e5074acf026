"""KV pressure seen per server: a real 0.5.23 server's retraction line and counters
(tests/fixtures/sglang/real-0.5.23/, recorded from the small-KV server) read into its figures,
the retractions counted over the alert window from either source, the kv_pressure alert and
its advice, and the supervisor watching servers started elsewhere ([servers] urls), whose rows
carry the same figures. The live counterpart is tests/real/test_kv_pressure.py."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import httpx
import pytest

from agents.rundir.schema import ServerStatus, Snapshot
from agents.rundir.spec import AlertsSection
from agents.supervise.alerts import AlertBook, kv_pressure
from agents.supervise.retractions import Retractions, counter_step
from agents.supervise.sglang_log import LogReader, parse_retraction, read_log
from agents.supervise.sglang_metrics import (
    ServerFigures,
    read_metrics,
    read_server_info,
    server_figures,
)
from tests.agent.test_sglang_real_0523 import REAL
from tests.plugins.supervised import agent, kill_run, wait_status
from tests.simserver import start_sim

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "sglang" / "metrics"


def _metrics(name: str) -> str:
    return (REAL / "metrics" / name).read_text()


# -- reading what the real server writes ----------------------------------------------------

def test_the_real_retraction_line_counts_the_requests_it_names() -> None:
    lines = (REAL / "decode" / "small-kv_retract.log").read_text().splitlines()
    assert lines
    named = 0
    for line in lines:
        rec = parse_retraction(line)
        assert rec is not None and rec.ranks == {} and rec.timestamp is not None, line
        # The record is the line's figure: "#retracted_reqs: N" as printed.
        assert f"#retracted_reqs: {rec.retracted}," in line
        named += rec.retracted
    reader = read_log(REAL / "decode" / "small-kv_retract.log")
    assert reader.retracted == named
    assert reader.last_retraction is not None
    assert reader.last_retraction.timestamp == parse_retraction(lines[-1]).timestamp  # type: ignore[union-attr]


def test_every_form_of_the_retraction_line_and_only_one_tp_rank_counts() -> None:
    forms = {
        # 0.5.x (the recorded one's shape), older servers, SGLang's debug mode.
        "[2026-12-01 22:02:03] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
        "#new_tokens_gained: 219, #new_token_ratio: 0.4482 -> 1.0000": 2,
        "[2025-03-07 21:49:33 TP0] Decode out of memory happened. #retracted_reqs: 3, "
        "#new_token_ratio: 0.1 -> 0.2": 3,
        "decode out of memory happened, #retracted_reqs: 1, #new_token_ratio: 0.5 -> 0.6": 1,
        "[2026-01-01 00:00:00 DP1 TP0] Testing retraction. #retracted_reqs: 4, "
        "#new_tokens_gained: 9": 4,
    }
    for line, n in forms.items():
        rec = parse_retraction(line)
        assert rec is not None and rec.retracted == n, line
    # The PD decode line's `#retracted-req:` field is a queue length, not a retraction.
    assert parse_retraction("[2026-01-01 00:00:00] Decode batch, #running-req: 1, "
                            "#retracted-req: 3, #queue-req: 0") is None
    reader = LogReader()
    for line in forms:
        reader.feed_line(line)
    reader.feed_line("[2025-03-07 21:49:33 TP1] Decode out of memory happened. "
                     "#retracted_reqs: 3, #new_token_ratio: 0.1 -> 0.2")  # TP0's, again
    assert reader.retracted == 2 + 3 + 1 + 4
    reader.feed_line("# fleetdeck: launching at 2026-12-01 23:00:00")
    assert reader.retracted == 0 and reader.last_retraction is None  # a new process


def test_the_real_counters_say_how_many_were_retracted_and_how_big_the_pool_is() -> None:
    after = read_metrics(_metrics("small-kv_after.txt"))
    # num_retracted_requests_total is the counter; num_retracted_reqs is a gauge (the last
    # interval's, with a pid label) that reads 0 here although one was retracted.
    assert after.retracted_total == 1
    assert "num_retracted_reqs" in _metrics("small-kv_after.txt")
    queued = read_metrics(_metrics("small-kv_queued.txt"))
    # Before its first retraction the server prints no counter at all, only the gauge: 0.
    assert "num_retracted_requests_total" not in _metrics("small-kv_queued.txt")
    assert queued.retracted_total == 0
    info = read_server_info(json.loads((REAL / "server_info" / "small-kv.json").read_text()))
    fig = server_figures(info, queued, None)
    assert fig.kv_capacity_tokens == 3072 == info.max_total_num_tokens
    assert fig.kv_used_tokens == 163 and fig.queued_reqs == 2  # kv_used_tokens, as exported
    # A server of before these names says nothing: unknown, never 0.
    for old in sorted(OLD.glob("*.txt")):
        assert read_metrics(old.read_text()).retracted_total is None, old.name


def test_the_log_counts_when_metrics_are_off() -> None:
    reader = read_log(REAL / "decode" / "small-kv_retract.log")
    fig = server_figures(None, None, None, None, reader.retracted)
    assert fig.retracted_total is None and fig.retracted_log == reader.retracted


# -- counting over the window ------------------------------------------------------------

def test_a_counter_step_survives_a_restart_and_unknown_readings() -> None:
    assert counter_step(None, 5) == 0 and counter_step(5, None) == 0
    assert counter_step(5, 9) == 4
    assert counter_step(9, 2) == 2  # the server started again: its count is from 0


def test_retractions_take_the_larger_source_and_leave_the_window() -> None:
    r = Retractions(window_s=60)
    r.add(0, ServerFigures(retracted_total=10, retracted_log=3))  # baselines
    assert r.seen == 0 and r.recent() == 0
    r.add(10, ServerFigures(retracted_total=12, retracted_log=4))
    assert r.seen == 2  # the same events in both: counted once, by the one that saw more
    r.add(20, ServerFigures(retracted_total=None, retracted_log=7))  # /metrics did not answer
    assert r.seen == 4  # the log saw 4 since watching began
    r.add(30, ServerFigures(retracted_total=15, retracted_log=7))  # the counter catches up
    assert r.seen == 5  # 10 -> 15: the log's 3 of before were these, not more
    assert r.recent() == 5
    r.add(100, ServerFigures(retracted_total=15, retracted_log=7))
    assert r.recent() == 0 and r.seen == 5  # the window moved past them


# -- the alert -----------------------------------------------------------------------------

CFG = AlertsSection(window_s=300)


def _row(**kw: object) -> ServerStatus:
    base: dict[str, object] = {"number": 0, "url": "http://127.0.0.1:30000", "state": "healthy",
                               "gpu": 0, "gpus": [0], "limit": 64, "in_flight": 64,
                               "running_reqs": 40, "queued_reqs": 24, "token_usage": 0.93,
                               "kv_capacity_tokens": 3072, "effective_max_running": 1536}
    base.update(kw)
    return ServerStatus(**base)  # type: ignore[arg-type]


def test_retractions_raise_kv_pressure_naming_the_figures_and_the_advice() -> None:
    book = AlertBook(CFG)
    assert not [a for a in book.evaluate(None, [_row(retracted_recent=0)], None, now=0)
                if a.code.startswith("kv")]
    alerts = book.evaluate(None, [_row(retracted_recent=3)], None, now=10)
    kv = [a for a in alerts if a.code == "kv_pressure:0"]
    assert len(kv) == 1 and kv[0].severity == "warning" and kv[0].server == 0
    msg = kv[0].message
    for figure in ("GPU 0", "3 requests retracted in the last 5 min", "token usage 93%",
                   "3,072 tokens", "24 queued", "lower concurrency or max_tokens"):
        assert figure in msg, msg
    since = kv[0].since
    again = book.evaluate(None, [_row(retracted_recent=1)], None, now=20)
    assert [a.since for a in again if a.code == "kv_pressure:0"] == [since]
    # Once none is left in the window and the queue no longer grows, it clears.
    assert not [a for a in book.evaluate(None, [_row(retracted_recent=0)], None, now=30)
                if a.code == "kv_pressure:0"]
    assert kv_pressure(_row(retracted_recent=5), deque(), AlertsSection(kv_retractions=0),
                       300) is None  # 0 turns the retraction rule off


def test_a_queue_growing_with_the_pool_full_under_the_cap_is_kv_pressure() -> None:
    book = AlertBook(CFG)
    book.evaluate(None, [_row(queued_reqs=0, token_usage=0.4)], None, now=0)
    alerts = book.evaluate(None, [_row(queued_reqs=22, token_usage=0.81, running_reqs=42)],
                           None, now=5)
    kv = [a for a in alerts if a.code == "kv_pressure:0"]
    assert kv and "queue grew from 0 to 22" in kv[0].message
    assert "42 running" in kv[0].message and "token usage 81%" in kv[0].message
    assert "lower concurrency or max_tokens" in kv[0].message
    # At its running cap the queue is the cap's doing (over_cap), not the pool's.
    book = AlertBook(CFG)
    book.evaluate(None, [_row(queued_reqs=0, effective_max_running=42)], None, now=0)
    assert not [a for a in book.evaluate(None, [_row(queued_reqs=22, running_reqs=42,
                                                     effective_max_running=42)], None, now=5)
                if a.code.startswith("kv")]
    # Room left in the pool: requests wait for a prefill step, not for room.
    book = AlertBook(CFG)
    book.evaluate(None, [_row(queued_reqs=0, token_usage=0.1)], None, now=0)
    assert not [a for a in book.evaluate(None, [_row(queued_reqs=3, token_usage=0.2)], None,
                                         now=5) if a.code.startswith("kv")]


def test_a_node_cannot_send_negative_kv_figures() -> None:
    snap = {"kind": "generate", "run": "r", "run_dir": "/r", "host": "h", "status": "running",
            "updated_at": 0.0, "source": "supervisor",
            "servers": [{"number": 0, "url": "u", "state": "healthy", "retracted_recent": -1}]}
    import msgspec

    with pytest.raises(msgspec.ValidationError, match="retracted_recent"):
        msgspec.convert(snap, Snapshot)
    for field in ("kv_capacity_tokens", "kv_used_tokens", "retracted_total"):
        bad = json.loads(json.dumps(snap))
        bad["servers"][0] = {"number": 0, "url": "u", "state": "healthy", field: -5}
        with pytest.raises(msgspec.ValidationError, match=field):
            msgspec.convert(bad, Snapshot)
    old = json.loads(json.dumps(snap))
    old["servers"][0] = {"number": 0, "url": "u", "state": "healthy"}  # before these fields
    row = msgspec.convert(old, Snapshot).servers[0]
    assert row.retracted_recent is None and row.kv_capacity_tokens is None


# -- servers started elsewhere ---------------------------------------------------------------

def test_a_supervised_run_on_urls_shows_each_servers_own_figures(tmp_path: Path) -> None:
    """[servers] urls and no GPUs: the supervisor reads each server's /metrics and
    /server_info itself; the rows carry them (the simulator's own figures), KV pool included,
    and no kv_pressure where nothing is retracted."""
    sim = start_sim(tmp_path, "--time-scale", "0.05", "--load-seconds", "0", "--enable-metrics")
    root = tmp_path / "r"
    root.mkdir()
    from tests.engine.runs import write_prompts

    write_prompts(root / "prompts.jsonl", 400)
    spec = root / "run.toml"
    spec.write_text("\n".join([
        "[run]", 'name = "urls"', 'dir = "run"', "", "[servers]",
        f"urls = {json.dumps([sim.url])}", "health_interval_s = 0.3", "", "[generate]",
        'prompts = "prompts.jsonl"', "max_tokens = 256", "concurrency_per_server = 8",
        "batch_size = 100", "request_timeout_s = 30.0", "connect_timeout_s = 2.0"]) + "\n")
    run_dir = root / "run"
    try:
        r = agent("up", str(spec))
        assert r.returncode == 0, r.stderr
        snap = wait_status(run_dir, lambda s: bool(s["servers"]) and s["servers"][0].get(
            "running_reqs") is not None and s["servers"][0].get("gen_throughput"), 60,
            "server 0's own figures on its row")
        row = snap["servers"][0]
        info = httpx.get(f"{sim.url}/server_info", timeout=10).json()
        assert row["kv_capacity_tokens"] == info["max_total_num_tokens"]
        assert row["retracted_recent"] == 0 and row["metrics_at"] is not None
        assert row["pid"] is None  # not ours: nothing here starts or stops it
        assert not [a for a in snap["alerts"] if a["code"].startswith("kv_pressure")]
    finally:
        agent("down", str(run_dir), "--yes")
        kill_run(run_dir)
        sim.kill()


def test_a_simulated_small_kv_pool_retracts_and_the_run_says_so(tmp_path: Path) -> None:
    """The simulator's KV pool (`--max-total-tokens`, as SGLang 0.5.23 admits and retracts):
    the supervisor counts the retractions from its counter, the row and the alert say so,
    deadlines do not storm, and the run ends with every index once."""
    from tests.engine.runs import read_run, write_prompts
    from tests.real.server import Metrics

    sim = start_sim(tmp_path, "--time-scale", "0.02", "--load-seconds", "0",
                    "--enable-metrics", "--max-total-tokens", "3072",
                    "--max-running-requests", "256")
    root = tmp_path / "r"
    root.mkdir()
    write_prompts(root / "prompts.jsonl", 160)
    spec = root / "run.toml"
    spec.write_text("\n".join([
        "[run]", 'name = "kv-sim"', 'dir = "run"', "", "[servers]",
        f"urls = {json.dumps([sim.url])}", "health_interval_s = 0.3", "", "[generate]",
        'prompts = "prompts.jsonl"', "max_tokens = 256", "concurrency_per_server = 64",
        "batch_size = 100", "request_timeout_s = 120.0", "connect_timeout_s = 2.0",
        "deadline_factor = 1.0", "min_deadline_s = 1.0"]) + "\n")
    run_dir = root / "run"
    before = Metrics.parse(httpx.get(f"{sim.url}/metrics", timeout=10).text)
    try:
        r = agent("up", str(spec))
        assert r.returncode == 0, r.stderr
        snap = wait_status(run_dir, lambda s: any(
            a["code"] == "kv_pressure:0" and "retracted" in a["message"]
            for a in s["alerts"]), 120, "kv_pressure:0 for the retractions")
        alert = next(a for a in snap["alerts"] if a["code"] == "kv_pressure:0")
        assert "lower concurrency or max_tokens" in alert["message"]
        assert snap["servers"][0]["kv_capacity_tokens"] == 3072
        done = wait_status(run_dir, lambda s: s["status"] in ("done", "failed"), 180,
                           "the run's end")
        assert done["status"] == "done", done.get("message")
        after = Metrics.parse(httpx.get(f"{sim.url}/metrics", timeout=10).text)
        retracted = after.delta(before, "num_retracted_requests_total")
        final = wait_status(run_dir, lambda s: s["servers"][0].get("retracted_total") ==
                            after["num_retracted_requests_total"], 30, "the row's counter")
        assert retracted > 0 and final["servers"][0]["retracted_recent"] == retracted
        # No storm: a few misses are a loaded machine's jitter at deadline_factor 1 (the
        # allowance itself is tested in tests/engine/test_kv_knee.py); a storm resends most.
        assert final["progress"]["deadline_misses"] <= 8, final["progress"]
        st = read_run(run_dir)
        assert set(st.current) == set(range(160)) and not st.failed
    finally:
        agent("down", str(run_dir), "--yes")
        kill_run(run_dir)
        sim.kill()
