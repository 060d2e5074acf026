"""The run supervisor with simulated GPU servers: health, restarts, adoption, confinement."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx

from agents.supervise.procinfo import alive, start_time
from tests.engine.runs import read_run
from tests.plugins.supervised import agent, rpc_status, wait_status
from tests.servers.ports import wait_until


def _healthy(snap: dict, n: int) -> bool:
    return len(snap["servers"]) == n and all(s["state"] == "healthy" for s in snap["servers"])


def test_up_four_servers_and_status_matches_the_simulators(supervised) -> None:
    # Slow simulated time and 3 requests per server: a steady state to compare against.
    run = supervised(4, prompts=400, sim_args="--time-scale 1", concurrency_per_server=3,
                     max_tokens=512)
    r = agent("up", str(run.spec))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["run_dir"] == str(run.run_dir)
    snap = wait_status(run.run_dir, lambda s: _healthy(s, 4) and all(
        x["in_flight"] == 3 and x["accept_length_cum"] is not None and x["gen_throughput"]
        for x in s["servers"]), 120, "4 healthy servers, busy, with figures")
    assert snap["source"] == "supervisor" and snap["kind"] == "generate"
    for n, server in enumerate(snap["servers"]):
        url = server["url"]
        # A request ends and the next is sent between any two looks: both sides agree on a
        # full server at one moment, not necessarily at the moment of the first look.
        wait_until(lambda n=n, url=url: rpc_status(run.run_dir)["servers"][n]["in_flight"] == 3 ==
                   httpx.get(f"{url}/sim/state", timeout=60).json()["in_flight"], 120,
                   f"server {n}: 3 in flight, as the simulator says")
        info = httpx.get(f"{url}/server_info", timeout=60).json()["internal_states"][0]
        assert abs(server["accept_length_cum"] - info["avg_spec_accept_length"]) < 0.3
        assert server["effective_max_running"] == info["effective_max_running_requests_per_dp"]
        assert server["running_reqs"] is not None and server["gpu_stats"] is None
        assert server["pid"] and start_time(server["pid"]) is not None
    launch = (run.run_dir / "launch" / "launch_gpu2.sh").read_text()
    assert "CUDA_VISIBLE_DEVICES=2" in launch and f"--port {snap['servers'][2]['port']}" in launch
    assert "The server is fired up" in (run.run_dir / "logs" / "sglang_gpu2.log").read_text()


def test_killed_server_goes_down_is_restarted_and_the_run_loses_nothing(supervised) -> None:
    run = supervised(2, prompts=1500, sim_args="--time-scale 0.2")
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: _healthy(s, 2) and s["progress"]
                and s["progress"]["completed"] > 100, 120, "running")
    victim = run.servers()[1]
    os.kill(victim["pid"], signal.SIGKILL)
    down = wait_status(run.run_dir, lambda s: s["servers"][1]["state"] in ("down", "restarting",
                                                                           "starting"),
                       120, "server 1 seen down")
    assert any(a["code"] == "server_down:1" for a in down["alerts"]) or \
        down["servers"][1]["state"] == "starting"
    back = wait_status(run.run_dir, lambda s: s["servers"][1]["state"] == "healthy"
                       and s["servers"][1]["restarts"] == 1, 120, "server 1 back")
    assert back["servers"][1]["pid"] != victim["pid"]
    done = wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "run done")
    assert done["progress"]["completed"] + done["progress"]["failed"] == 1500
    st = read_run(run.run_dir)
    assert st.todo == set() and len(st.current) == done["progress"]["completed"]


def test_killed_supervisor_is_resumed_adopting_servers(supervised) -> None:
    run = supervised(2, prompts=1500, sim_args="--time-scale 0.2")
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["progress"] and s["progress"]["completed"] > 100, 120,
                "running")
    before = run.servers()
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    assert rpc_status(run.run_dir)["source"] == "disk"
    # Server 1's pid is "reused": the server dies and another process takes its record's pid.
    os.kill(before[1]["pid"], signal.SIGKILL)
    wait_until(lambda: not alive(before[1]["pid"]), 120, "server 1 gone")
    impostor = subprocess.Popen(["sleep", "300"], start_new_session=True)
    records = run.servers()
    records[1]["pid"] = impostor.pid
    (run.run_dir / "servers.json").write_text(json.dumps(records))
    try:
        r = agent("resume", str(run.run_dir))
        assert r.returncode == 0, r.stderr
        snap = wait_status(run.run_dir, lambda s: _healthy(s, 2) and s["status"] == "running",
                           120, "resumed")
        after = run.servers()
        assert after[0]["pid"] == before[0]["pid"]
        assert after[0]["start_ticks"] == before[0]["start_ticks"] == start_time(after[0]["pid"])
        assert after[1]["pid"] not in (before[1]["pid"], impostor.pid)
        assert impostor.poll() is None, "the process that took the pid was not touched"
        assert snap["supervisor_pid"] != before[0]["pid"]
        log = (run.run_dir / "logs" / "supervisor.log").read_text()
        assert "server 0 adopted" in log
        done = wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "done")
        st = read_run(run.run_dir)
        assert st.todo == set() and len(st.current) == done["progress"]["completed"]
    finally:
        impostor.kill()
        impostor.wait()


def test_busy_server_with_slow_health_is_not_declared_down(supervised) -> None:
    # Two running slots and a deep queue: the health check's 1-token request waits its turn.
    run = supervised(1, prompts=300, sim_args="--time-scale 1 --max-running-requests 2",
                     concurrency_per_server=24, max_tokens=512)
    assert agent("up", str(run.spec)).returncode == 0
    snap = wait_status(run.run_dir, lambda s: _healthy(s, 1) and s["servers"][0]["in_flight"]
                       == 24, 120, "saturated")
    url = snap["servers"][0]["url"]
    t = time.monotonic()
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200
    slow = time.monotonic() - t
    assert slow > 0.6, f"health answered in {slow:.2f} s: not busy enough to test anything"
    states = set()
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        s = rpc_status(run.run_dir)["servers"][0]
        states.add(s["state"])
        assert s["restarts"] == 0
    assert states <= {"healthy", "degraded"}, states


def test_paths_are_confined_to_the_run_dir(supervised, tmp_path: Path) -> None:
    run = supervised(1, prompts=50)
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "done")
    r = agent("logs", str(run.run_dir), "../../etc/passwd")
    assert r.returncode == 2 and "'..' is refused" in r.stderr
    r = agent("logs", str(run.run_dir), "/etc/passwd")
    assert r.returncode == 2 and "absolute" in r.stderr
    (run.run_dir / "logs" / "escape.log").symlink_to("/etc/passwd")
    r = agent("logs", str(run.run_dir), "escape")
    assert r.returncode == 2 and "symbolic link" in r.stderr
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.log").write_text("secret\n")
    (run.run_dir / "linkdir").symlink_to(tmp_path / "outside")
    r = agent("logs", str(run.run_dir), "linkdir/x.log")
    assert r.returncode == 2 and "secret" not in r.stdout
    r = agent("logs", str(run.run_dir), "supervisor", "-n", "3")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3


def test_long_run_dir_path_still_gets_a_socket(supervised, tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-folder-name-for-a-run-" * 3) / ("x" * 60)
    run = supervised(1, prompts=50, root=deep)
    assert len(str(run.run_dir / "agent.sock")) > 107
    assert agent("up", str(run.spec)).returncode == 0
    snap = wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "done")
    assert snap["source"] == "supervisor"
    sock = Path((run.run_dir / "agent.sock.path").read_text().strip())
    assert len(str(sock)) < 107 and (os.stat(sock).st_mode & 0o777) == 0o600


def test_stop_drains_keeps_servers_and_down_ends_all(supervised) -> None:
    run = supervised(1, prompts=2000, sim_args="--time-scale 0.5")
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["progress"] and s["progress"]["completed"] > 20, 120,
                "running")
    assert agent("stop", str(run.run_dir)).returncode == 2  # needs --yes
    assert agent("stop", str(run.run_dir), "--yes").returncode == 0
    snap = wait_status(run.run_dir, lambda s: s["status"] == "stopped", 120, "stopped")
    assert snap["servers"][0]["state"] == "healthy" and snap["progress"]["in_flight"] == 0
    assert not list((run.run_dir / "completions").glob("*.partial"))
    server_pid = run.servers()[0]["pid"]
    sup = run.supervisor_pid()
    assert agent("down", str(run.run_dir), "--yes").returncode == 0
    wait_until(lambda: not alive(sup) and not alive(server_pid), 120, "all down")
    log = [json.loads(x)["method"] for x in
           (run.run_dir / "control.log.jsonl").read_text().splitlines()]
    assert log == ["launch", "stop", "down"]


def test_unreachable_s3_fails_the_job_with_a_reason_not_the_supervisor(supervised) -> None:
    run = supervised(1, prompts=20)
    run.spec.write_text(run.spec.read_text() + '\n[s3]\nbucket = "nowhere"\n'
                        'endpoint_url = "http://127.0.0.1:9"\nregion = "us-east-1"\n')
    assert agent("up", str(run.spec)).returncode == 0
    snap = wait_status(run.run_dir, lambda s: s["status"] == "failed", 120, "job failed")
    assert snap["source"] == "supervisor", "the supervisor itself must stay up"
    assert "[s3] bucket 'nowhere'" in snap["message"]
    r = agent("generate", str(run.spec))
    assert r.returncode == 2 and "need the supervisor" in r.stderr


def test_down_and_resume_during_server_start_up(supervised) -> None:
    # Servers that take ten minutes to load (12,000 simulated seconds at the plugin's time
    # scale of 0.05): the supervisor is still starting them however slow the machine.
    # A start-up timeout longer than that, so that down alone can end the start.
    run = supervised(1, prompts=50, sim_args="--load-seconds 12000",
                     servers={"startup_timeout_s": 1200})
    assert agent("up", str(run.spec)).returncode == 0
    r = agent("resume", str(run.run_dir))
    assert r.returncode == 1 and "still starting" in r.stderr
    sup = run.supervisor_pid()
    assert agent("down", str(run.run_dir), "--yes").returncode == 0
    wait_until(lambda: not alive(sup), 120, "supervisor gone")
    # Down stopped the server while it loaded: it waited neither for the load nor for the
    # start-up timeout, after which the server would be down or restarting.
    states = re.findall(r"server 0: (\w+) -> (\w+)",
                        (run.run_dir / "logs" / "supervisor.log").read_text())
    assert states and states[-1] == ("starting", "stopped"), states
    assert {after for _, after in states} <= {"starting", "stopped"}, states
    assert not (run.run_dir / "progress.json").exists(), "the job started after down"
