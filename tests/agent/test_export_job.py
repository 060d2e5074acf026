"""`export` on a training node: the agent starts the trainer's own `fleetdeck-train export` as
a detached job (log `export`), one at a time, refuses it on a generation run and under a
read-only key, and never loads torch itself."""

from __future__ import annotations

import json
from pathlib import Path

from tests.agent.stdio import request, serve
from tests.servers.ports import wait_until
from tests.trainer.tinyworld import write_spec


def _train_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "target").mkdir()
    spec = write_spec(tmp_path / "run.toml", str(tmp_path / "data"), tmp_path / "target", run_dir)
    (run_dir / "run.toml").write_text(spec.read_text())
    (run_dir / "run.base").write_text(str(tmp_path))
    return run_dir


def test_export_runs_the_trainers_export_as_a_job_and_its_answer_is_in_the_log(
        tmp_path: Path) -> None:
    run_dir = _train_run(tmp_path)
    out = serve(run_dir, request(1, "hello", protocol=1), request(2, "export"))
    assert out.code == 0, out.stderr
    started = out.by_id(2)["result"]
    assert started["log"] == "export" and started["started"] > 0, started
    log = run_dir / "logs" / "export.log"

    def finished() -> bool:
        return "fleetdeck-train export" in log.read_text() and "$ " in log.read_text() and \
            len(log.read_text().splitlines()) >= 2

    # No checkpoint yet: the trainer's export refuses, naming what is missing, and the
    # refusal is in the job's log, which `logs` serves by name.
    wait_until(finished, 120, "the export job's answer in logs/export.log", interval=0.2)
    text = log.read_text()
    assert "Traceback" not in text, text
    assert "checkpoint" in text.lower(), text
    audit = [json.loads(x) for x in (run_dir / "control.log.jsonl").read_text().splitlines()]
    assert audit[-1]["method"] == "export"
    served = serve(run_dir, request(1, "logs", name="export", n=20))
    assert any("checkpoint" in line.lower() for line in served.by_id(1)["result"]["lines"])


def test_export_is_refused_on_a_generation_run_and_under_a_read_only_key(
        tmp_path: Path) -> None:
    run_dir = _train_run(tmp_path)
    looked = serve(run_dir, request(1, "export"), args=("--read-only",))
    err = looked.by_id(1)["error"]
    assert "read-only" in err["message"], err
    assert not (run_dir / "logs" / "export.log").exists()
    spec = (run_dir / "run.toml").read_text().replace('kind = "train"', 'kind = "generate"')
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "run.toml").write_text(spec.split("[train]")[0])
    out = serve(gen, request(1, "export"))
    assert "error" in out.by_id(1), out.replies
    assert "Traceback" not in out.stderr
