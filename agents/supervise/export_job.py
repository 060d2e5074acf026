"""The drafter's export as a job on a training node: `fleetdeck-train export RUN_DIR/run.toml`
started detached (its own session, output in logs/export.log), one at a time. The agent only
starts the trainer's command; it never imports torch itself."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents.rundir.control import audit
from agents.rundir.spec import SpecError, load_run_spec
from agents.supervise.procinfo import same_process, start_time

PID_FILE = "export.pid"
LOG_NAME = "export"


class ExportRefused(RuntimeError):
    """Why no export was started: the message names the run directory and the reason."""


def running_export(run_dir: Path) -> int | None:
    """The pid of a live export of this run, or None (a stale pid file is ignored)."""
    try:
        pid_text, started_text = (run_dir / PID_FILE).read_text().split()[:2]
        pid, started = int(pid_text), int(started_text)
    except (OSError, ValueError):
        return None
    return pid if same_process(pid, started) else None


def start_export(run_dir: Path, checkpoint: str = "best", who: str | None = None) -> dict[str, Any]:
    try:
        spec = load_run_spec(run_dir)
    except SpecError as exc:
        raise ExportRefused(str(exc)) from None
    if spec.run.kind != "train":
        raise ExportRefused(f"{run_dir}: a {spec.run.kind} run; only a training run has a "
                            "drafter to export")
    if checkpoint not in ("best", "latest"):
        raise ExportRefused(f"checkpoint must be best or latest, got {checkpoint!r}")
    live = running_export(run_dir)
    if live is not None:
        raise ExportRefused(f"{run_dir}: an export is running (pid {live}); see logs "
                            f"{LOG_NAME}")
    logfile = run_dir / "logs" / f"{LOG_NAME}.log"
    logfile.parent.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "trainer.cli", "export", str(run_dir / "run.toml"),
            "--checkpoint", checkpoint]
    with open(logfile, "ab") as out:
        out.write(f"$ {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=run_dir, start_new_session=True)
    started = start_time(proc.pid)
    tmp = run_dir / f".{PID_FILE}.tmp"
    tmp.write_text(f"{proc.pid} {started if started is not None else 0}\n")
    os.replace(tmp, run_dir / PID_FILE)
    audit(run_dir, "export", {"checkpoint": checkpoint}, who)
    return {"started": proc.pid, "log": LOG_NAME, "to": "export"}


__all__ = ["ExportRefused", "running_export", "start_export"]
