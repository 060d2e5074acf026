"""A truncated or out-of-range control.json: the engine keeps the last good control, says so
in progress.json's message and in the log, and goes on (at start and while it runs)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.engine.runs import read_run, start_engine, wait_progress, write_prompts, write_spec


def test_a_truncated_control_json_mid_run_keeps_the_last_good_control(tmp_path: Path,
                                                                       sims) -> None:
    sim = sims("--time-scale", "0.1")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 400)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=40,
                      concurrency_per_server=4, max_tokens=256)
    engine = start_engine(spec)
    run_dir = tmp_path / "run"
    wait_progress(engine, lambda p: p["completed"] >= 20, 120, "first completions")
    control = run_dir / "control.json"
    good = control.read_bytes()
    control.write_bytes(good[: len(good) // 2])
    seen = wait_progress(engine, lambda p: "control.json ignored" in (p.get("message") or ""),
                         120, "the unreadable control.json said in status")
    assert "keeps the last good control (rev 1: max_tokens 256, concurrency 4)" in \
        seen["message"]
    wait_progress(engine, lambda p: p["completed"] >= seen["completed"] + 20, 120,
                  "generation going on")
    # Out of range is unusable too.
    control.write_text(json.dumps({"rev": 5, "concurrency": {"default": -3},
                                   "max_tokens": 256}))
    wait_progress(engine, lambda p: "must not be negative" in (p.get("message") or ""), 120,
                  "negative concurrency refused")
    # Readable again, with a change: applied, and the note is gone.
    control.write_text(json.dumps({"rev": 6, "concurrency": {"default": 6},
                                   "max_tokens": 128}))
    wait_progress(engine, lambda p: p["max_tokens"] == 128 and p["message"] is None
                  and p["control_rev"] == 6, 120, "the repaired control applied")
    assert engine.wait(300) == 0, engine.stderr()
    log = (run_dir / "logs" / "generate.log").read_text()
    assert "control.json ignored" in log and "Traceback" not in engine.stderr()
    st = read_run(run_dir)
    assert st.todo == set() and len(st.current) == 400


def test_an_unreadable_control_json_at_start_runs_on_the_last_good_one(tmp_path: Path,
                                                                       sims) -> None:
    sim = sims("--time-scale", "0.1")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 200)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=40,
                      concurrency_per_server=4, max_tokens=256)
    engine = start_engine(spec)
    run_dir = tmp_path / "run"
    wait_progress(engine, lambda p: p["completed"] >= 20, 120, "first completions")
    (run_dir / "control.json").write_text(json.dumps(
        {"rev": 2, "concurrency": {"default": 3}, "max_tokens": 100}))
    wait_progress(engine, lambda p: p["control_rev"] == 2, 120, "rev 2 applied")
    engine.proc.terminate()
    assert engine.wait(300) == 0, engine.stderr()
    for broken in (b'{"rev": 3, "concurr', b"", b"\x00\x01 not json"):
        (run_dir / "control.json").write_bytes(broken)
        resumed = start_engine(spec)
        pid = resumed.proc.pid
        p = wait_progress(resumed, lambda p, pid=pid: p["status"] == "running"
                          and p["pid"] == pid, 120, "resumed on the last good control")
        assert (p["max_tokens"], p["concurrency"], p["control_rev"]) == (100, 3, 2)
        assert "control.json ignored" in (p["message"] or "")
        resumed.proc.terminate()
        assert resumed.wait(300) == 0, resumed.stderr()
        assert "Traceback" not in resumed.stderr()
        assert "control.json ignored" in resumed.stderr()
    (run_dir / "control.json").write_text(json.dumps(
        {"rev": 4, "concurrency": {"default": 8}, "max_tokens": 100}))
    final = start_engine(spec)
    assert final.wait(300) == 0, final.stderr()
    st = read_run(run_dir)
    assert st.todo == set() and len(st.current) == 200
