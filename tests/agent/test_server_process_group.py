"""A server is its whole process group: what a launch process leaves behind is killed before a
new server takes its GPUs, a hung (stopped) server is killed at once, and a new supervisor
adopts a server that is still loading instead of starting its load over (and its relaunch of
one server keeps the records of those it has not reached), and a figures read that the
server's death cut short does not hide why it died. The real SGLang
0.5.23 behaviour behind each rule is in tests/real/test_supervise_real.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents.rundir.spec import load_spec
from agents.supervise.procinfo import alive, group_is_ours, group_members, start_time
from agents.supervise.servers import ManagedServer, ServerSet
from tests.plugins.supervised import agent, rpc_status, wait_status
from tests.servers.ports import wait_until

SIM = (f"{sys.executable} -m agents.sim --port {{port}} --model-path {{model}} "
       "--time-scale 0.05 --load-seconds 0.5 --enable-metrics")


def _state(pid: int) -> str | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None
    return data[data.rfind(b")") + 2:][:1].decode()


def test_group_members_are_the_group_stopped_ones_too_zombies_not(tmp_path: Path) -> None:
    # The short child ends when told (a byte down its FIFO), not after a sleep: on a loaded
    # machine a `sleep 0.1` child could be gone before the group was first looked at.
    fifo = tmp_path / "end-short-child"
    os.mkfifo(fifo)
    leader = subprocess.Popen(["/bin/sh", "-c", f"sleep 60 & head -c 1 {fifo} >/dev/null & wait"],
                              start_new_session=True)
    try:
        wait_until(lambda: len(group_members(leader.pid)) == 3, 120, "shell and two children")
        fifo.write_bytes(b"x")
        wait_until(lambda: len(group_members(leader.pid)) == 2, 120, "the short child gone")
        os.killpg(leader.pid, signal.SIGSTOP)
        members = group_members(leader.pid)
        wait_until(lambda: all(_state(p) == "T" for p in members), 120, "all stopped")
        assert group_members(leader.pid) == members == sorted(members)
        assert group_is_ours(leader.pid, start_time(leader.pid))
        assert not group_is_ours(leader.pid, (start_time(leader.pid) or 0) + 1)
        os.killpg(leader.pid, signal.SIGKILL)  # stopped processes die of SIGKILL too
        wait_until(lambda: group_members(leader.pid) == [], 120, "group gone")
        # The reaped-later leader is a zombie, not a member; the number still names the group.
        assert group_is_ours(leader.pid, None)
    finally:
        leader.kill()
        leader.wait()
    assert group_members(leader.pid) == []


def test_what_a_killed_launch_process_leaves_is_killed_before_the_relaunch(
        supervised, tmp_path: Path) -> None:
    # A launch process with a child that does not die with it (a scheduler without
    # PDEATHSIG, still holding the GPUs).
    wrapper = tmp_path / "with_child.sh"
    wrapper.write_text("#!/bin/sh\nsleep 600 &\nexec \"$@\"\n")
    run = supervised(1, prompts=20, command=f"/bin/sh {wrapper} {SIM}")
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["servers"][0]["state"] == "healthy", 120, "healthy")
    pid = run.servers()[0]["pid"]
    children = [p for p in group_members(pid) if p != pid]
    assert len(children) == 1 and alive(children[0])
    os.kill(pid, signal.SIGKILL)  # the launch process alone
    back = wait_status(run.run_dir, lambda s: s["servers"][0]["state"] == "healthy"
                       and s["servers"][0]["restarts"] == 1, 120, "relaunched")
    assert back["servers"][0]["pid"] != pid
    assert not alive(children[0]), "the child of the killed server outlived it"
    assert group_members(pid) == []
    log = (run.run_dir / "logs" / "supervisor.log").read_text()
    killed = log.index(f"process {children[0]} still there 10 s after its launch process died")
    assert killed < log.rindex("server 0 launched"), "relaunched before the group was gone"


def test_a_stopped_server_is_down_then_killed_at_once_and_relaunched(supervised) -> None:
    # A health timeout a loaded machine's live server answers within (3 s was missed twice in
    # a row, and the relaunched server called down again); a stopped one never answers.
    run = supervised(1, prompts=20, servers={"health_timeout_s": 10, "health_failures_to_down": 2,
                                             "hung_restart_s": 1})
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["servers"][0]["state"] == "healthy", 120, "healthy")
    pid = run.servers()[0]["pid"]
    os.killpg(pid, signal.SIGSTOP)
    down = wait_status(run.run_dir, lambda s: s["servers"][0]["state"] == "down", 120,
                       "the stopped server called down")
    assert down["servers"][0]["pid"] == pid and down["servers"][0]["restarts"] == 0
    assert _state(pid) == "T", "down while it is still there, stopped: hung, not dead"
    wait_status(run.run_dir, lambda s: s["servers"][0]["state"] == "healthy"
                and s["servers"][0]["restarts"] == 1, 120, "relaunched")
    assert not alive(pid) and group_members(pid) == []
    log = (run.run_dir / "logs" / "supervisor.log").read_text()
    assert f"server 0 is hung: SIGKILL to its process group (process {pid})" in log
    assert "still there 10 s after SIGTERM" not in log


def test_a_new_supervisor_adopts_a_server_that_is_still_loading(supervised) -> None:
    # A load of 60 s at its time scale: still loading when the new supervisor first looks,
    # however long a loaded machine takes to kill one supervisor and start the next.
    run = supervised(1, prompts=20, sim_args="--load-seconds 1200",
                     servers={"startup_timeout_s": 600})
    before_up = time.time()
    assert agent("up", str(run.spec)).returncode == 0
    wait_until(lambda: (run.run_dir / "servers.json").exists(), 120, "the server launched")
    loading = run.servers()[0]
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    r = agent("resume", str(run.run_dir))
    assert r.returncode == 0, r.stderr
    snap = wait_status(run.run_dir, lambda s: s["source"] == "supervisor", 120, "new supervisor")
    assert snap["servers"][0]["state"] == "starting"
    ready = wait_status(run.run_dir, lambda s: s["servers"][0]["state"] == "healthy", 300,
                        "the adopted server ready")
    assert ready["servers"][0]["pid"] == loading["pid"] and ready["servers"][0]["restarts"] == 0
    assert run.servers()[0]["start_ticks"] == loading["start_ticks"] == start_time(loading["pid"])
    log = (run.run_dir / "logs" / "supervisor.log").read_text()
    assert f"server 0 adopted while it loads (pid {loading['pid']}" in log
    assert rpc_status(run.run_dir)["servers"][0]["started_at"] == loading["started_at"]
    assert before_up <= loading["started_at"] <= time.time()


def test_a_figures_read_cut_by_the_servers_death_does_not_hide_why(tmp_path: Path) -> None:
    # Seen on the real server: SIGKILL cut the supervisor's /metrics read ("Server
    # disconnected without sending a response"), and that became the dead server's last error
    # in place of "process N exited".
    (tmp_path / "prompts.jsonl").write_text("")
    (tmp_path / "run.toml").write_text(
        '[run]\nname = "t"\n[servers]\ngpus = [0]\nmodel = "m"\ncommand = "sleep 1"\n'
        '[generate]\nprompts = "prompts.jsonl"\n')
    servers = ServerSet(load_spec(tmp_path / "run.toml"), tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    server = servers.servers[0]
    server.pid, server.start_ticks, server.state = dead.pid, 1, "healthy"
    server.last_error = f"process {dead.pid} exited"
    servers._figures_failed(server, "figures from x: RemoteProtocolError: Server disconnected")
    assert server.last_error == f"process {dead.pid} exited"
    me = os.getpid()
    server.pid, server.start_ticks = me, start_time(me)
    servers._figures_failed(server, "figures from x: ReadTimeout")  # alive: it says so
    assert server.last_error == "figures from x: ReadTimeout"
    server.state = "down"
    servers._figures_failed(server, "figures from x: ConnectError")
    assert server.last_error == "figures from x: ReadTimeout"


def test_a_resume_that_relaunches_one_server_keeps_the_next_ones_record(tmp_path: Path) -> None:
    # Seen in the power-loss torture: the resume's launch of server 0 saved servers.json with
    # server 1 as never started (pid None, restarts 0), durably, before it reached server 1.
    # A crash in between forgot server 1's restart (and would orphan a server 1 still alive).
    (tmp_path / "prompts.jsonl").write_text("")
    (tmp_path / "run.toml").write_text(
        '[run]\nname = "t"\n[servers]\ngpus = [0, 1]\nbase_port = 47100\nmodel = "m"\n'
        'command = "sleep 60"\n[generate]\nprompts = "prompts.jsonl"\n')
    dead = subprocess.Popen(["true"])
    dead.wait()
    before = [{"number": n, "gpu": n, "port": 47100 + n, "pid": dead.pid, "start_ticks": 1,
               "started_at": 1.0, "restarts": n + 2, "gpus": [n]} for n in (0, 1)]
    (tmp_path / "servers.json").write_text(json.dumps(before))
    servers = ServerSet(load_spec(tmp_path / "run.toml"), tmp_path)
    seen: list[list[dict[str, Any]]] = []
    launch = servers.launch

    def launch_and_look(server: ManagedServer) -> None:
        launch(server)
        seen.append(json.loads((tmp_path / "servers.json").read_bytes()))

    servers.launch = launch_and_look  # type: ignore[method-assign]
    try:
        asyncio.run(servers.adopt_or_launch())
    finally:
        for s in servers.servers:
            if s.pid is not None:
                os.killpg(s.pid, signal.SIGKILL)
                if s.proc is not None:
                    s.proc.wait()
        asyncio.run(servers.close())
    first, second = seen
    assert first[0]["pid"] == servers.servers[0].pid and first[0]["restarts"] == 2
    assert first[1] == before[1]  # not reached yet: its record as it was
    assert second[1]["pid"] == servers.servers[1].pid and second[1]["restarts"] == 3
    final = json.loads((tmp_path / "servers.json").read_bytes())
    assert [r["restarts"] for r in final] == [2, 3]
