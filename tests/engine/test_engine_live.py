"""Live control, S3 outages and retries while the engine runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx

from tests.engine.runs import read_run, start_engine, wait_progress, write_prompts, write_spec
from tests.servers.ports import wait_until
from tests.servers.s3 import S3Server


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], capture_output=True,
                          text=True, timeout=180)


def sim_state(url: str) -> dict:
    return httpx.get(f"{url}/sim/state", timeout=60).json()


def test_resize_max_tokens_and_pause_while_running(tmp_path: Path, sims) -> None:
    sim = sims("--time-scale", "0.5", "--max-running-requests", "64")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 3000)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], concurrency_per_server=4,
                      max_tokens=128)
    engine = start_engine(spec)
    run_dir = engine.run_dir
    try:
        wait_until(lambda: sim_state(sim.url)["in_flight"] == 4, 120, "4 in flight")
        assert agent("resize", str(run_dir), "20").returncode == 0
        wait_progress(engine, lambda p: p["control_rev"] == 2 and p["concurrency"] == 20, 120,
                      "resize applied")
        wait_until(lambda: sim_state(sim.url)["in_flight"] == 20, 120, "20 in flight at the sim")
        assert agent("max-tokens", str(run_dir), "512").returncode == 0
        wait_progress(engine, lambda p: p["max_tokens"] == 512, 120, "max tokens applied")
        wait_until(lambda: sim_state(sim.url)["max_tokens_counts"].get("512", 0) > 0, 120,
                   "requests with max_tokens 512")
        assert agent("resize", str(run_dir), "2").returncode == 0
        # Lowering lets in-flight requests finish: the count drains down to the new limit.
        wait_until(lambda: sim_state(sim.url)["in_flight"] <= 2, 120, "drained to 2")
        assert agent("pause", str(run_dir)).returncode == 0
        wait_progress(engine, lambda p: p["status"] == "paused" and p["in_flight"] == 0, 120,
                      "paused and drained")
        received = sim_state(sim.url)["requests_total"]
        assert sim_state(sim.url)["requests_total"] == received
        assert agent("unpause", str(run_dir)).returncode == 0
        wait_until(lambda: sim_state(sim.url)["requests_total"] > received, 120, "sending again")
        assert agent("resize", str(run_dir), "--server", "0", "6").returncode == 0
        wait_progress(engine, lambda p: p["servers"]["0"]["limit"] == 6, 120, "per-server limit")
    finally:
        engine.proc.terminate()
        engine.wait(300)
    log = [json.loads(x) for x in (run_dir / "control.log.jsonl").read_text().splitlines()]
    assert [e["method"] for e in log] == ["resize", "max_tokens", "resize", "pause", "unpause",
                                          "resize"]
    assert all(e["who"] for e in log)
    assert sim_state(sim.url)["max_in_flight"] <= 20


def test_control_verbs_refuse_a_missing_run_and_values_out_of_range(tmp_path: Path,
                                                                   sims) -> None:
    r = agent("resize", str(tmp_path / "nope"), "3")
    assert r.returncode == 2 and "not a run directory" in r.stderr
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 5)
    spec = write_spec(tmp_path / "run.toml", prompts, [sims().url], max_concurrency=64)
    assert start_engine(spec).wait(300) == 0
    r = agent("resize", str(tmp_path / "run"), "65")
    assert r.returncode == 2 and "max_concurrency 64" in r.stderr
    r = agent("max-tokens", str(tmp_path / "run"), "-5")
    assert r.returncode == 2
    r = agent("retry", str(tmp_path / "run"), "everything")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    control = json.loads((tmp_path / "run" / "control.json").read_text())
    assert control["rev"] == 1, "a refused call must not write control.json"


def test_s3_killed_mid_run_and_restarted(tmp_path: Path, sims, s3: S3Server) -> None:
    sim = sims("--time-scale", "0.05")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 800)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], s3=s3, batch_size=40)
    engine = start_engine(spec, env=s3.env())
    wait_progress(engine, lambda p: p["s3_uploaded"] >= 1, 120, "a first upload")
    s3.kill()
    seen = wait_progress(engine, lambda p: p["s3_pending"] >= 2, 120, "uploads pile up")
    assert seen["s3_error"] and seen["status"] == "running"
    at_outage = seen["completed"]
    wait_progress(engine, lambda p: p["completed"] > at_outage + 80, 120,
                  "generation goes on while S3 is down")
    s3.restart()
    assert engine.wait(300) == 0, engine.stderr()
    progress = json.loads((engine.run_dir / "progress.json").read_text())
    assert progress["s3_pending"] == 0 and progress["s3_error"] is None
    st = read_run(engine.run_dir)
    assert st.todo == set()
    closed = sorted(p.name for p in (engine.run_dir / "completions").glob("*.jsonl"))
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket)["Contents"]}
    journals = {"runs/test/journals/run/run.pin.json", "runs/test/journals/run/failures.jsonl"}
    assert keys - journals == {f"runs/test/{n}" for n in closed}
    assert journals <= keys  # the pin and failures.jsonl are there too


def test_retry_truncated_after_max_tokens_raise(tmp_path: Path, sims) -> None:
    sim = sims("--truncation-share", "0.3")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], max_tokens=64, batch_size=40)
    assert start_engine(spec).wait(300) == 0
    run_dir = tmp_path / "run"
    st = read_run(run_dir)
    truncated = {i for i, line in st.current.items() if line["finish_reason"] == "length"}
    assert len(truncated) > 30
    before = json.loads((run_dir / "progress.json").read_text())
    assert before["truncated"] == len(truncated)
    assert agent("max-tokens", str(run_dir), "4096").returncode == 0
    assert agent("retry", str(run_dir), "truncated").returncode == 0
    engine = start_engine(spec)
    assert engine.wait(300) == 0, engine.stderr()
    st = read_run(run_dir)
    for i in truncated:
        line = st.current[i]
        assert line["attempt"] == 2 and line["max_tokens"] == 4096
    untouched = set(st.current) - truncated
    assert all(st.current[i]["attempt"] == 1 for i in untouched)
    after = json.loads((run_dir / "progress.json").read_text())
    still = sum(1 for line in st.current.values() if line["finish_reason"] == "length")
    assert after["truncated"] == still < len(truncated)
    assert after["completed"] == 300
    # A second resume does not redo the retry.
    again = start_engine(spec)
    assert again.wait(300) == 0
    assert read_run(run_dir).lines == st.lines


def test_retry_truncated_while_running_writes_no_line_twice(tmp_path: Path, sims) -> None:
    sim = sims("--answer-median", "300", "--time-scale", "0.05")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 1500)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], max_tokens=64, batch_size=40,
                      concurrency_per_server=32)
    engine = start_engine(spec)
    run_dir = tmp_path / "run"
    wait_progress(engine, lambda p: p["truncated"] >= 40, 120, "some truncated lines")
    assert agent("max-tokens", str(run_dir), "2048").returncode == 0
    assert agent("retry", str(run_dir), "truncated").returncode == 0
    assert engine.wait(300) == 0, engine.stderr()
    st = read_run(run_dir)  # asserts no (index, attempt) line twice, done = lines
    assert st.todo == set() and len(st.current) == 1500
    retried = [line for line in st.current.values() if line["attempt"] == 2]
    assert retried and all(line["max_tokens"] == 2048 for line in retried)
    # Counted per the limit each answer ran with (what the truncation alert judges by).
    # Every line on disk, superseded ones too, against the counts: exact, whatever the timing
    # (how many were truncated before the retry, how many of the later answers ran long).
    answers: Counter[str] = Counter()
    truncated: Counter[str] = Counter()
    for path in (run_dir / "completions").glob("completions_*.jsonl*"):
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            answers[str(line["max_tokens"])] += 1
            truncated[str(line["max_tokens"])] += line["finish_reason"] == "length"
    progress = json.loads((run_dir / "progress.json").read_text())
    # Each retried line superseded a line truncated at 64.
    assert truncated["64"] >= max(40, len(retried)) and answers["2048"] >= len(retried)
    for limit in ("64", "2048"):
        assert progress["answers_by_limit"].get(limit, 0) == answers[limit], limit
        assert progress["truncated_by_limit"].get(limit, 0) == truncated[limit], limit


def test_a_full_disk_stops_the_engine_cleanly_and_resume_finishes(tmp_path: Path, sims) -> None:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 400)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=30)
    full = start_engine(spec, env={"FLEETDECK_FAIL_AT": "write_group:4"})
    assert full.wait(300) == 1, full.stderr()
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["status"] == "failed"
    assert "No space left on device" in progress["message"] and "resume" in progress["message"]
    before = read_run(tmp_path / "run")
    assert 0 < len(before.current) < 400
    resumed = start_engine(spec)
    assert resumed.wait(300) == 0, resumed.stderr()
    st = read_run(tmp_path / "run")
    assert st.todo == set() and len(st.current) + len(st.failed) == 400


def test_retry_failed_turns_failures_into_completions(tmp_path: Path, sims) -> None:
    flaky = sims("--error-rate", "0.4")
    prompts = tmp_path / "prompts.jsonl"
    bad = write_prompts(prompts, 300, bad_every=50)
    spec = write_spec(tmp_path / "run.toml", prompts, [flaky.url], retries=1, batch_size=40)
    assert start_engine(spec).wait(300) == 0
    run_dir = tmp_path / "run"
    st = read_run(run_dir)
    failed_before = st.failed - bad
    assert len(failed_before) > 30 and bad <= st.failed
    steady = sims()
    spec = write_spec(tmp_path / "run.toml", prompts, [steady.url], retries=1, batch_size=40)
    assert agent("retry", str(run_dir), "failed").returncode == 0
    again = start_engine(spec)
    assert again.wait(300) == 0, again.stderr()
    st = read_run(run_dir)
    assert failed_before <= set(st.current), "every failed index was generated again"
    assert st.failed == bad, "malformed prompts stay failed: retrying cannot fix them"
    assert all(st.current[i]["attempt"] == 1 for i in failed_before)
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["failed"] == len(bad) and progress["completed"] == 300 - len(bad)
    # A second resume does not retry again.
    assert start_engine(spec).wait(300) == 0
    assert read_run(run_dir).lines == st.lines


def _loops_on_disk(st) -> tuple[set[int], set[int]]:
    """(loops, long) among the current truncated lines, told by the sim's own mark of a loop
    (its last LOOP_PERIOD words repeat the ones before), not by the engine's classifier."""
    from agents.sim.output import LOOP_PERIOD

    loops, long = set(), set()
    for i, line in st.current.items():
        if line["finish_reason"] != "length":
            continue
        words = (line["content"] or line["reasoning_content"] or "").split()
        looped = len(words) > 2 * LOOP_PERIOD and \
            words[-LOOP_PERIOD:] == words[-2 * LOOP_PERIOD:-LOOP_PERIOD]
        (loops if looped else long).add(i)
    return loops, long


def test_retry_truncated_long_only_leaves_the_loops(tmp_path: Path, sims) -> None:
    """A fifth of the prompts loop: status splits the truncated into loops and long ones,
    `retry truncated --long-only` sends exactly the long ones again, and a rebuild of the
    totals from the batch lines gives the same split."""
    sim = sims("--truncation-share", "0.3", "--loop-share", "0.2")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], max_tokens=400, batch_size=40)
    assert start_engine(spec).wait(300) == 0
    run_dir = tmp_path / "run"
    loops, long = _loops_on_disk(read_run(run_dir))
    assert len(loops) > 30 and len(long) > 30
    before = json.loads((run_dir / "progress.json").read_text())
    assert (before["truncated"], before["truncated_loops"]) == (len(loops) + len(long),
                                                                len(loops))
    assert agent("max-tokens", str(run_dir), "800").returncode == 0
    assert agent("retry", str(run_dir), "truncated", "--long-only").returncode == 0
    engine = start_engine(spec)
    assert engine.wait(300) == 0, engine.stderr()
    st = read_run(run_dir)
    again = {i for i, line in st.current.items() if line["attempt"] == 2}
    assert again == long
    assert all(st.current[i]["max_tokens"] == 800 for i in again)
    assert all(st.current[i]["attempt"] == 1 and st.current[i]["max_tokens"] == 400
               for i in loops)
    after = json.loads((run_dir / "progress.json").read_text())
    loops_now, long_now = _loops_on_disk(st)
    assert loops_now == loops  # the loops untouched, still loops
    assert (after["truncated"], after["truncated_loops"]) == (len(loops) + len(long_now),
                                                              len(loops))
    # A totals.json from an engine before loops were told apart: counted again, the same.
    record = json.loads((run_dir / "totals.json").read_text())
    del record["loops"], record["looped"]
    (run_dir / "totals.json").write_text(json.dumps(record))
    (run_dir / "progress.json").unlink()
    engine = start_engine(spec)
    assert engine.wait(300) == 0, engine.stderr()
    assert "keeps no loop bits" in engine.stderr()
    rebuilt = json.loads((run_dir / "progress.json").read_text())
    assert (rebuilt["truncated"], rebuilt["truncated_loops"]) == (after["truncated"],
                                                                  after["truncated_loops"])
    # Nothing in a run dir is trusted: without totals.json and progress.json the split is
    # rebuilt from the batch lines alone, the same.
    (run_dir / "totals.json").unlink()
    (run_dir / "progress.json").unlink()
    assert start_engine(spec).wait(300) == 0
    rebuilt = json.loads((run_dir / "progress.json").read_text())
    assert (rebuilt["truncated"], rebuilt["truncated_loops"]) == (after["truncated"],
                                                                  after["truncated_loops"])
    assert read_run(run_dir).lines == st.lines  # and the retry is not done again
