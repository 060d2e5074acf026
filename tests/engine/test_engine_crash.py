"""Crash safety: the engine SIGKILLs itself at named points, or is killed at random; a resume
must end with invariant 1 exact and no batch number reused."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from tests.engine.runs import read_run, start_engine, wait_progress, write_prompts, write_spec
from tests.servers.s3 import S3Server


@pytest.mark.parametrize("point", ["lines_written:3", "lines_fsynced:3", "batch_close:2",
                                   "upload:2"])
def test_crash_point_then_resume(point: str, tmp_path: Path, sims, s3: S3Server) -> None:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300, bad_every=97)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], s3=s3, batch_size=25)
    crashed = start_engine(spec, env={**s3.env(), "FLEETDECK_CRASH_AT": point})
    assert crashed.wait(300) == -signal.SIGKILL, crashed.stderr()
    before = read_run(crashed.run_dir, after_kill=True)  # consistent even right after it
    resumed = start_engine(spec, env=s3.env())
    assert resumed.wait(300) == 0, resumed.stderr()
    st = read_run(resumed.run_dir)
    assert st.todo == set()
    assert set(before.current) <= set(st.current)
    assert len(st.current) + len(st.failed) == 300 and st.lines == len(st.current)
    progress = json.loads((resumed.run_dir / "progress.json").read_text())
    assert progress["completed"] == len(st.current) and progress["failed"] == len(st.failed)
    uploads = [json.loads(x)["batch"] for x in
               (resumed.run_dir / "uploads.jsonl").read_text().splitlines()]
    closed = sorted(p.name for p in (resumed.run_dir / "completions").glob("*.jsonl"))
    assert sorted(set(uploads)) == closed and progress["s3_pending"] == 0


def test_kill_9_at_random_moments_under_load(tmp_path: Path, sims) -> None:
    servers = [sims("--seed", i).url for i in range(2)]
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 1500)
    spec = write_spec(tmp_path / "run.toml", prompts, servers, batch_size=60,
                      concurrency_per_server=24)
    rng = random.Random(7)
    done = 0
    for round_ in range(4):
        engine = start_engine(spec, tag=str(round_))
        target = done + rng.randint(40, 250)
        wait_progress(engine, lambda p, t=target: p["completed"] >= t or p["status"] == "done",
                      120, f"round {round_} progress")
        if engine.proc.poll() is not None:
            break
        os.kill(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait(300)
        st = read_run(engine.run_dir, after_kill=True)  # consistent at every kill
        assert len(st.current) >= done
        done = len(st.current)
    final = start_engine(spec, tag="final")
    assert final.wait(300) == 0, final.stderr()
    st = read_run(final.run_dir)
    assert st.todo == set() and len(st.current) == 1500 and st.lines == 1500
