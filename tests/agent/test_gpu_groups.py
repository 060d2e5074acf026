"""Servers that span GPUs (`[servers] gpus = [[0, 1], [2, 3]]`): each group is one server,
launched with CUDA_VISIBLE_DEVICES="0,1" and `--tp {tp}` rendered as `--tp 2`; status names
the groups; a SIGKILLed server comes back on the same group, and a new supervisor adopts only
a server whose record names the same group (a record from before groups is read as [gpu])."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agents.rundir.schema import GpuStats
from agents.supervise.procinfo import alive
from agents.supervise.snapshot import group_stats
from tests.plugins.supervised import Run, agent, rpc_status, wait_status
from tests.servers.ports import wait_until

GROUPS = [[0, 1], [2, 3]]
# {tp} and {gpus} are the launch template's: the simulator takes SGLang's --tp and reports it.
TP_ARGS = "--tp {tp} --served-model-name sim-on-{gpus}"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode().split("=", 1) for x in raw if b"=" in x)


def _argv(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def _healthy(snap: dict, n: int) -> bool:
    return len(snap["servers"]) == n and all(s["state"] == "healthy" for s in snap["servers"])


def _assert_on_group(run: Run, number: int, group: list[int]) -> None:
    """The server's launch script, its live process and its own answer all say `group`."""
    rec = run.servers()[number]
    assert rec["gpus"] == group and rec["gpu"] == group[0], rec
    visible = ",".join(map(str, group))
    script = (run.run_dir / "launch" / f"launch_gpu{group[0]}.sh").read_text()
    assert f"export CUDA_VISIBLE_DEVICES={visible}\n" in script, script
    assert f" --tp {len(group)} " in script and f"sim-on-{visible}\n" in script, script
    assert _environ(rec["pid"])["CUDA_VISIBLE_DEVICES"] == visible
    argv = _argv(rec["pid"])
    assert argv[argv.index("--tp") + 1] == str(len(group)), argv
    info = httpx.get(f"http://127.0.0.1:{rec['port']}/server_info", timeout=60).json()
    assert info["tp_size"] == len(group), info
    assert info["served_model_name"] == f"sim-on-{visible}", info


def _fleet(root: Path, run_dir: Path) -> Path:
    fleet = root / "fleet.toml"
    fleet.write_text(f'[[nodes]]\nname = "gen-1"\nlocal = true\nrun_dir = "{run_dir}"\n'
                     f'agent = "{sys.executable} -m agents.cli"\n')
    return fleet


def test_grouped_servers_launch_show_restart_and_are_adopted_on_their_groups(
        supervised, tmp_path: Path) -> None:
    run = supervised(gpus=GROUPS, prompts=3000, sim_args=f"--time-scale 0.2 {TP_ARGS}")
    r = agent("up", str(run.spec))
    assert r.returncode == 0, r.stderr
    snap = wait_status(run.run_dir, lambda s: _healthy(s, 2), 120, "2 healthy grouped servers")
    assert [(s["gpu"], s["gpus"]) for s in snap["servers"]] == [(0, [0, 1]), (2, [2, 3])]
    for number, group in enumerate(GROUPS):
        _assert_on_group(run, number, group)

    # Status names the groups: the agent's own, and the console's headless one.
    text = agent("status", str(run.run_dir))
    assert text.returncode == 0, text.stderr
    assert "server 0 (GPU 0-1) healthy" in text.stdout, text.stdout
    assert "server 1 (GPU 2-3) healthy" in text.stdout, text.stdout
    console = subprocess.run([sys.executable, "-m", "console.cli", "--fleet",
                              str(_fleet(tmp_path, run.run_dir)), "status", "gen-1"],
                             capture_output=True, text=True, timeout=180)
    assert console.returncode == 0, console.stdout + console.stderr
    assert "server 0 (GPU 0-1) healthy:" in console.stdout, console.stdout
    assert "server 1 (GPU 2-3) healthy:" in console.stdout, console.stdout

    # A SIGKILLed grouped server comes back on the same group, with the same --tp.
    victim = run.servers()[1]
    os.kill(victim["pid"], signal.SIGKILL)
    back = wait_status(run.run_dir, lambda s: s["servers"][1]["restarts"] == 1
                       and s["servers"][1]["state"] == "healthy", 120, "server 1 relaunched")
    assert back["servers"][1]["pid"] != victim["pid"]
    assert back["servers"][1]["gpus"] == [2, 3]
    _assert_on_group(run, 1, [2, 3])

    # A new supervisor adopts both: same pids, same groups, the restart count kept.
    before = run.servers()
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    wait_until(lambda: rpc_status(run.run_dir)["source"] == "disk", 120, "the supervisor gone")
    r = agent("resume", str(run.run_dir))
    assert r.returncode == 0, r.stderr
    snap = wait_status(run.run_dir, lambda s: _healthy(s, 2) and s["source"] == "supervisor",
                       120, "resumed")
    after = run.servers()
    assert [s["pid"] for s in after] == [s["pid"] for s in before]
    assert [s["gpus"] for s in after] == GROUPS
    assert snap["servers"][1]["restarts"] == 1
    log = (run.run_dir / "logs" / "supervisor.log").read_text()
    assert "server 0 adopted (pid" in log and "GPU 0-1)" in log
    assert "server 1 adopted (pid" in log and "GPU 2-3)" in log
    agent("down", str(run.run_dir), "--yes")
    wait_until(lambda: not any(alive(s["pid"]) for s in after), 120, "servers stopped")


def test_a_record_on_another_group_is_replaced_and_an_old_record_is_read_as_one_gpu(
        supervised) -> None:
    """Server 0's record is as a supervisor from before groups wrote it (no `gpus`): read as
    GPU 0 alone, it is not the [0, 1] server the spec asks for, so that process is stopped (it
    holds GPU 0) and a new one starts on 0,1. Server 1's record names its own group: adopted."""
    run = supervised(gpus=GROUPS, prompts=3000, sim_args=f"--time-scale 0.2 {TP_ARGS}")
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: _healthy(s, 2), 120, "2 healthy grouped servers")
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    wait_until(lambda: rpc_status(run.run_dir)["source"] == "disk", 120, "the supervisor gone")
    before = run.servers()
    records = [dict(before[0]), before[1]]
    del records[0]["gpus"]
    (run.run_dir / "servers.json").write_text(json.dumps(records))
    r = agent("resume", str(run.run_dir))
    assert r.returncode == 0, r.stderr
    wait_status(run.run_dir, lambda s: _healthy(s, 2) and s["source"] == "supervisor", 120,
                "resumed")
    after = run.servers()
    assert after[1]["pid"] == before[1]["pid"], "the server on its own group was adopted"
    assert after[0]["pid"] != before[0]["pid"]
    wait_until(lambda: not alive(before[0]["pid"]), 120, "the old server 0 stopped")
    _assert_on_group(run, 0, [0, 1])
    log = (run.run_dir / "logs" / "supervisor.log").read_text()
    assert "runs on GPU 0 (now 0-1): replacing it" in log, log


@pytest.mark.parametrize("gpus", [[0], [[0]]], ids=["flat", "group-of-one"])
def test_one_gpu_renders_tp_1_and_a_record_from_before_groups_is_adopted(
        supervised, gpus: list) -> None:
    """gpus = [0] as always, or [[0]] (the real-SGLang check's spec): `--tp {tp}` is `--tp 1`
    and CUDA_VISIBLE_DEVICES=0; a servers.json written before groups (no `gpus`: read as
    [gpu]) is adopted."""
    run = supervised(gpus=gpus, prompts=2000, sim_args=f"--time-scale 0.2 {TP_ARGS}")
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: _healthy(s, 1), 120, "healthy")
    _assert_on_group(run, 0, [0])
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    wait_until(lambda: rpc_status(run.run_dir)["source"] == "disk", 120, "the supervisor gone")
    before = run.servers()
    old = [{k: v for k, v in rec.items() if k != "gpus"} for rec in before]
    (run.run_dir / "servers.json").write_text(json.dumps(old))
    assert agent("resume", str(run.run_dir)).returncode == 0
    snap = wait_status(run.run_dir, lambda s: _healthy(s, 1) and s["source"] == "supervisor",
                       120, "resumed")
    assert run.servers()[0]["pid"] == before[0]["pid"]
    assert snap["servers"][0]["gpus"] == [0] and snap["servers"][0]["gpu"] == 0
    assert run.servers()[0]["gpus"] == [0], "the next record names the group"


def test_a_groups_gpu_figures_are_summed_averaged_or_the_hottest() -> None:
    """NVML is absent on the test machines, so the rule is checked on its own: memory and
    power summed, utilisation the mean, temperature the hottest, and a figure one GPU lacks
    is unknown for the group (never a sum over part of it)."""
    a = GpuStats(util_pct=90.0, mem_used_mib=1000.0, mem_total_mib=80_000.0, temp_c=60.0,
                 power_w=500.0)
    b = GpuStats(util_pct=70.0, mem_used_mib=3000.0, mem_total_mib=80_000.0, temp_c=71.0,
                 power_w=450.0)
    assert group_stats([a, b]) == GpuStats(util_pct=80.0, mem_used_mib=4000.0,
                                           mem_total_mib=160_000.0, temp_c=71.0, power_w=950.0)
    assert group_stats([a]) == a
    half = group_stats([a, GpuStats(util_pct=50.0)])
    assert half == GpuStats(util_pct=70.0)
