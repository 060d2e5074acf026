"""`verify` on a live run is not a false alarm: lines written but not yet recorded, a progress
count read a moment earlier, a batch closing while it is read and uploads still pending are the
normal gaps of a running engine. verify judges what is committed, says how much is in flight,
and reports the run as live, not broken (issue 11, item 14). The same gaps in a run whose
engine is gone are named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import agents.artifacts.verify as verify_mod
from agents.artifacts.verify import verify_run
from tests.artifacts.conftest import MadeRun
from tests.engine.runs import start_engine, wait_progress, write_prompts, write_spec
from tests.servers.ports import kill_pid
from tests.servers.s3 import S3Server
from tests.simserver import FAST_ARGS, start_sim


def _failed(report) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {c.name: c.detail for c in report.checks if not c.ok}


def _as_live(run_dir: Path, pid: int) -> None:
    progress = json.loads((run_dir / "progress.json").read_text())
    progress.update(status="running", pid=pid)
    (run_dir / "progress.json").write_text(json.dumps(progress))


def _open_batch_with_unrecorded_tail(run_dir: Path, recorded: int, unrecorded: int) -> None:
    """A live engine's open batch: `recorded` lines committed, then a group written whose
    indices are not yet in .done_indices, then half a line being written."""
    comp = run_dir / "completions"
    template = json.loads((comp / "completions_000000.jsonl").read_text().splitlines()[0])
    new = [99, 199, *range(300, 300 + recorded + unrecorded - 2)]
    lines = [{**template, "index": i, "attempt": 1} for i in new]
    (comp / "completions_000008.jsonl.partial").write_text(
        "".join(json.dumps(x) + "\n" for x in lines) + '{"index": 7')
    with open(comp / ".done_indices", "a") as f:
        f.write("".join(f"{i}\n" for i in new[:recorded]))
    pin = json.loads((run_dir / "run.pin.json").read_text())
    pin["prompts_lines"] = 400
    (run_dir / "run.pin.json").write_text(json.dumps(pin))


def test_a_live_run_between_write_and_record_is_live_not_broken(
        run_copy: Path, s3_env: S3Server, made_run: MadeRun) -> None:
    _open_batch_with_unrecorded_tail(run_copy, recorded=3, unrecorded=5)
    _as_live(run_copy, os.getpid())  # progress.json's count is from before the new lines
    report = verify_run(run_copy)
    assert report.ok, report.problems
    detail = {c.name: c.detail for c in report.checks}
    assert "live" in detail and "5 lines written, not yet recorded" in detail["live"]
    assert "not recorded in .done_indices" not in " ".join(detail.values())
    assert report.run_status == "running"

    # The same files with the engine gone: not live, and the gap is named as what it is.
    _as_live(run_copy, _dead_pid())
    report = verify_run(run_copy)
    failed = _failed(report)
    assert not report.ok and "done_indices_match_lines" in failed
    assert "the open batch" in failed["done_indices_match_lines"]
    assert "a resume records them" in failed["done_indices_match_lines"]
    detail = {c.name: c.detail for c in report.checks}
    assert "is gone" in detail.get("live", "") or "not running" in detail.get("live", "")


def test_a_live_run_with_a_real_problem_still_fails(run_copy: Path, s3_env: S3Server) -> None:
    """Live is no blanket excuse: a closed batch's line missing from .done_indices fails."""
    done = run_copy / "completions" / ".done_indices"
    kept = [x for x in done.read_text().splitlines() if x != "5"]
    done.write_text("\n".join(kept) + "\n")
    _as_live(run_copy, os.getpid())
    report = verify_run(run_copy)
    failed = _failed(report)
    assert "done_indices_match_lines" in failed
    assert "batch lines for indices 5 in completions_000000.jsonl are not recorded" in \
        failed["done_indices_match_lines"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_verify_during_a_real_run_never_reports_a_false_alarm(tmp_path: Path) -> None:
    """The engine writing as fast as it can while verify runs again and again: every report
    while it lives is ok, with the run called live."""
    (tmp_path / "sim").mkdir()
    sim = start_sim(tmp_path / "sim", *FAST_ARGS)
    try:
        _race(tmp_path, sim.url)
    finally:
        kill_pid(sim.proc)


def _race(tmp_path: Path, url: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 3000)
    spec = write_spec(tmp_path / "run.toml", prompts, [url], batch_size=37,
                      concurrency_per_server=64)
    engine = start_engine(spec)
    run_dir = tmp_path / "run"
    wait_progress(engine, lambda p: p["completed"] >= 100, 120, "first completions")
    reports = []
    while engine.proc.poll() is None:
        report = verify_run(run_dir)
        if engine.proc.poll() is not None:
            break  # it ended during this verify: the report may say either
        reports.append(report)
        assert report.ok, (report.run_status, report.problems)
    assert engine.wait(300) == 0, engine.stderr()
    live = [r for r in reports if any(c.name == "live" for c in r.checks)]
    assert len(live) >= 3, f"only {len(live)} reports while the engine ran"
    final = verify_run(run_dir)
    assert final.ok and not any(c.name == "live" for c in final.checks), final.problems


def test_a_batch_closing_while_verify_reads_it_is_no_problem(
        run_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The open batch is listed, then renamed to its closed name before it is opened."""
    comp = run_copy / "completions"
    last = sorted(comp.glob("completions_*.jsonl"))[-1]
    partial = last.with_name(last.name + ".partial")
    os.replace(last, partial)
    _as_live(run_copy, os.getpid())
    real = verify_mod.scan_batch
    renamed: list[Path] = []

    def scan_after_close(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if path == partial and not renamed:
            os.replace(partial, last)  # the engine closes it between the listing and the open
            renamed.append(last)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(verify_mod, "scan_batch", scan_after_close)
    report = verify_run(run_copy)
    assert renamed
    assert "cannot read" not in " ".join(report.problems), report.problems
    assert report.counted.closed_batches == len(list(comp.glob("*.jsonl")))
