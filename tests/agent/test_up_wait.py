"""`fleetdeck-agent up --wait`, as a scheduler's task runs it: in the foreground until the job
ends, its fate the exit status, nothing of the run left behind; SIGTERM drains it; a
supervisor killed under it is named."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from agents.cli.exits import EXIT_FAILED, EXIT_GAVE_UP, EXIT_LOST, EXIT_OK, EXIT_STOPPED
from agents.supervise.procinfo import alive, group_members
from tests.engine.runs import read_run
from tests.plugins.supervised import Run, agent, wait_status
from tests.servers.ports import wait_until

# Bounds for a machine under load: a test never waits this long unless something is wrong.
RUN_S = 300
STOP_S = 180


def up_wait(run: Run, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "agents.cli", "up", str(run.spec), "--wait",
                             *more], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def supervising(run: Run, proc: subprocess.Popen[str]) -> None:
    """Wait for `up --wait` to have a supervisor running the run."""
    def check() -> bool:
        assert proc.poll() is None, proc.communicate()
        return (run.run_dir / "supervisor.pid").exists()

    wait_until(check, RUN_S, "a supervisor running the run")


def logged_supervisor(run: Run) -> int:
    """The pid of the run's last supervisor, from its log (its pid file goes as it exits)."""
    log = (run.run_dir / "logs" / "supervisor.log").read_text()
    return int(re.findall(r"supervisor (\d+) for ", log)[-1])


def nothing_left(run: Run, supervisor: int) -> None:
    """No supervisor and no process of any server's group runs any more."""
    assert not alive(supervisor), f"supervisor {supervisor} still runs"
    assert not (run.run_dir / "supervisor.pid").exists()
    for server in run.servers():
        assert not group_members(server["pid"]), f"server {server['number']} still runs"


def progress(run: Run) -> dict:
    return json.loads((run.run_dir / "progress.json").read_text())


def test_up_wait_exits_0_when_done_and_leaves_nothing_running(supervised) -> None:
    run = supervised(2, prompts=300)
    proc = up_wait(run)
    out, err = proc.communicate(timeout=RUN_S)
    assert proc.returncode == EXIT_OK, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "done (300 of 300 completed, 0 failed)" in lines[0], err
    assert str(run.run_dir) in lines[0]
    # --wait took everything down at the end: the supervisor's log says why.
    nothing_left(run, logged_supervisor(run))
    assert "down (the job ended)" in (run.run_dir / "logs" / "supervisor.log").read_text()
    st = read_run(run.run_dir)
    assert st.todo == set() and len(st.current) == 300
    assert progress(run)["status"] == "done"


def test_sigterm_drains_the_job_goes_down_and_resume_finishes_it(supervised) -> None:
    run = supervised(1, prompts=300, sim_args="--time-scale 0.5")
    proc = up_wait(run)
    supervising(run, proc)
    wait_status(run.run_dir, lambda s: s["status"] == "running" and s["progress"]
                and s["progress"]["completed"] > 20 and s["progress"]["in_flight"] > 0,
                RUN_S, "running, requests in flight")
    supervisor = run.supervisor_pid()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=STOP_S)
    assert proc.returncode == EXIT_STOPPED, err
    assert "stopped on SIGTERM, drained" in err and str(run.run_dir) in err, err
    nothing_left(run, supervisor)
    # Drained: nothing in flight, the open batch closed, every line on disk accounted for.
    p = progress(run)
    assert p["status"] == "stopped" and p["in_flight"] == 0 and p["failed"] == 0
    assert 20 < p["completed"] < 300
    assert not list((run.run_dir / "completions").glob("*.partial"))
    st = read_run(run.run_dir)
    assert len(st.current) == p["completed"]
    methods = [json.loads(x)["method"] for x in
               (run.run_dir / "control.log.jsonl").read_text().splitlines()]
    assert methods == ["launch", "down"]
    r = agent("resume", str(run.run_dir))
    assert r.returncode == 0, r.stderr
    done = wait_status(run.run_dir, lambda s: s["status"] == "done", RUN_S, "resumed run done")
    st = read_run(run.run_dir)
    assert st.todo == set() and len(st.current) == done["progress"]["completed"] == 300


def test_a_second_sigterm_stops_the_waiting_and_the_run_still_goes_down(supervised) -> None:
    # Slow answers: the drain outlasts the two signals.
    run = supervised(1, prompts=200, sim_args="--time-scale 1", max_tokens=512)
    proc = up_wait(run)
    supervising(run, proc)
    wait_status(run.run_dir, lambda s: s["status"] == "running" and s["progress"]
                and s["progress"]["in_flight"] > 0, RUN_S, "requests in flight")
    supervisor = run.supervisor_pid()
    proc.send_signal(signal.SIGTERM)
    # Two signals at once are one (the kernel does not queue them): the second comes once
    # the first has asked the supervisor down.
    wait_until(lambda: '"method":"down"' in
               (run.run_dir / "control.log.jsonl").read_text().replace(" ", ""), STOP_S,
               "down asked")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=STOP_S)
    assert proc.returncode == EXIT_GAVE_UP, err
    assert f"a second SIGTERM: not waiting for the drain; its supervisor (pid {supervisor})" \
        in err, err
    # Left alone, the supervisor still drains and takes everything down.
    wait_until(lambda: not alive(supervisor), STOP_S, "the supervisor gone")
    nothing_left(run, supervisor)
    assert progress(run)["status"] == "stopped"


def test_killed_supervisor_is_named_its_servers_stopped_and_up_again_finishes(
        supervised) -> None:
    run = supervised(2, prompts=600, sim_args="--time-scale 0.2")
    proc = up_wait(run)
    supervising(run, proc)
    wait_status(run.run_dir, lambda s: s["status"] == "running" and s["progress"]
                and s["progress"]["completed"] > 20, RUN_S, "running")
    supervisor = run.supervisor_pid()
    os.kill(supervisor, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=STOP_S)
    took = time.monotonic() - killed
    assert proc.returncode == EXIT_LOST, err
    assert f"supervisor (pid {supervisor}) was killed by SIGKILL" in err, err
    assert "stopped the servers it left (0, 1)" in err
    # The servers get SIGTERM and 10 s, then SIGKILL: well inside the bound, however loaded.
    assert took < STOP_S
    wait_until(lambda: all(not group_members(s["pid"]) for s in run.servers()), 30,
               "the servers gone")
    # The scheduler's retry: the same command goes on from the run directory.
    again = up_wait(run)
    _, err = again.communicate(timeout=RUN_S)
    assert again.returncode == EXIT_OK, err
    st = read_run(run.run_dir)
    assert st.todo == set() and len(st.current) == 600


def test_a_job_that_cannot_start_exits_failed_with_the_reason(supervised) -> None:
    # A campaign node (--node sets [queue] node) whose S3 does not answer: the engine refuses.
    run = supervised(1, prompts=20)
    run.spec.write_text(run.spec.read_text() + '\n[s3]\nbucket = "nowhere"\n'
                        'endpoint_url = "http://127.0.0.1:9"\nregion = "us-east-1"\n')
    r = agent("up", str(run.spec), "--node", "../x")
    assert r.returncode == 2 and "[queue] node: '../x'" in r.stderr, r.stderr
    proc = up_wait(run, "--node", "gen-3")
    _, err = proc.communicate(timeout=RUN_S)
    assert proc.returncode == EXIT_FAILED, err
    assert "failed: the engine refused to start" in err and "nowhere" in err, err
    assert 'node = "gen-3"' in (run.run_dir / "run.toml").read_text()
    nothing_left(run, logged_supervisor(run))
