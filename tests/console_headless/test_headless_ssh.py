"""The headless console over a real sshd: status, host keys, unreachable nodes, reconnection,
bootstrap, and the promise that this path never imports Textual."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.rundir.schema import Snapshot
from console.fleet import Node
from console.transport import AgentLink
from tests.plugins.supervised import agent, wait_status
from tests.servers.ports import free_ports
from tests.servers.sshd import SshServer, start_sshd

AGENT = f"{sys.executable} -m agents.cli"


def node_toml(name: str, sshd: SshServer, run_dir: Path, port: int | None = None,
              known_hosts: Path | None = None, agent_cmd: str = AGENT,
              connect_timeout_s: float = 30) -> str:
    """A node's fleet entry; a live sshd's handshake on a loaded machine takes seconds."""
    return "\n".join([
        "[[nodes]]", f'name = "{name}"', 'host = "127.0.0.1"', f"port = {port or sshd.port}",
        f'user = "{sshd.user}"', f'identity_file = "{sshd.client_key}"',
        f'known_hosts = "{known_hosts or sshd.known_hosts}"', f'run_dir = "{run_dir}"',
        f'agent = "{agent_cmd}"', f"connect_timeout_s = {connect_timeout_s}", ""])


def fleetdeck(fleet: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def running(supervised) -> Any:
    run = supervised(1, prompts=4000, sim_args="--time-scale 0.5", concurrency_per_server=4)
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["status"] == "running", 120, "running")
    return run


def test_status_over_ssh_validates_and_never_imports_textual(sshd: SshServer, running,
                                                              tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, running.run_dir))
    probe = (
        "import sys, console.cli as c\n"
        f"rc = c.main(['--fleet', {str(fleet)!r}, 'status', '--json'])\n"
        "assert 'textual' not in sys.modules, sorted(m for m in sys.modules if 'textual' in m)\n"
        "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (entry,) = out["nodes"]
    assert entry["link"] == "connected"
    snap = msgspec.convert(entry["snapshot"], Snapshot)  # the schema, strictly typed
    assert snap.source == "supervisor" and snap.progress is not None
    assert snap.progress.completed >= 0 and snap.servers[0].state == "healthy"
    human = fleetdeck(fleet, "status")
    assert human.returncode == 0 and "gen-1: generate agent-test running" in human.stdout
    # A verb over the same transport.
    r = fleetdeck(fleet, "resize", "gen-1", "3")
    assert r.returncode == 0, r.stderr
    wait_status(running.run_dir, lambda s: s["progress"]["concurrency"] == 3, 120, "resized")
    assert fleetdeck(fleet, "stop", "gen-1").returncode == 2  # dangerous: needs --yes
    assert fleetdeck(fleet, "--read-only", "stop", "gen-1", "--yes").returncode == 2


def test_exit_on_alert(sshd: SshServer, supervised, tmp_path: Path) -> None:
    run = supervised(1, prompts=3000, sim_args="--time-scale 0.3 --max-running-requests 2",
                     concurrency_per_server=6)
    assert agent("up", str(run.spec)).returncode == 0
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, run.run_dir))
    r = fleetdeck(fleet, "status", "--json", "--watch", "--exit-on-alert", timeout=180)
    assert r.returncode == 1
    last = json.loads(r.stdout.splitlines()[-1])
    codes = {a["code"] for a in last["nodes"][0]["snapshot"]["alerts"]}
    assert "over_cap:0" in codes


def test_host_keys_changed_refused_unknown_needs_consent(sshd: SshServer, running,
                                                         tmp_path: Path) -> None:
    other = start_sshd(tmp_path / "other")  # another host key on another port
    try:
        changed = tmp_path / "known_changed"
        pub = other.host_public_key.read_text().split()
        changed.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(node_toml("gen-1", sshd, running.run_dir, known_hosts=changed))
        r = fleetdeck(fleet, "--accept-new-host-key", "status")
        assert r.returncode == 3 and "CHANGED" in r.stdout
        empty = tmp_path / "known_empty"
        empty.write_text("")
        fleet.write_text(node_toml("gen-1", sshd, running.run_dir, known_hosts=empty))
        r = fleetdeck(fleet, "status")
        assert r.returncode == 3 and "unknown host key SHA256:" in r.stdout
        r = fleetdeck(fleet, "--accept-new-host-key", "status")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"[127.0.0.1]:{sshd.port}" in empty.read_text()
        assert fleetdeck(fleet, "status").returncode == 0  # now known
    finally:
        other.kill()


def test_unreachable_nodes_are_named_while_a_good_one_answers(sshd: SshServer, running,
                                                              tmp_path: Path) -> None:
    closed_port = free_ports(1)[0]
    mutes = [socket.socket() for _ in range(3)]
    for mute in mutes:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)  # accepts TCP, never speaks SSH
    frozen = start_sshd(tmp_path / "frozen")
    frozen.freeze()
    # Four dead nodes that each take their whole connect timeout: one after another they
    # would take 4 x dead_s; together, one dead_s and the console's own start-up, which a
    # loaded machine stretches by seconds, not by three more dead_s.
    dead_s = 10
    try:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(node_toml("good", sshd, running.run_dir)
                         + node_toml("closed", sshd, running.run_dir, port=closed_port)
                         + "".join(node_toml(f"mute-{i}", sshd, running.run_dir,
                                             port=m.getsockname()[1], connect_timeout_s=dead_s)
                                   for i, m in enumerate(mutes))
                         + node_toml("frozen", frozen, running.run_dir,
                                     connect_timeout_s=dead_s))
        t = time.monotonic()
        r = fleetdeck(fleet, "status", "--json")
        took = time.monotonic() - t
        assert r.returncode == 3
        nodes = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
        assert nodes["good"]["link"] == "connected" and nodes["good"]["snapshot"]
        assert "connection refused" in nodes["closed"]["error"]
        for i in range(len(mutes)):
            assert "no SSH answer" in nodes[f"mute-{i}"]["error"]
        assert "no SSH answer" in nodes["frozen"]["error"]
        assert took < 4 * dead_s, f"took {took:.0f} s: the dead nodes were waited for one " \
            "after another"
    finally:
        frozen.thaw()
        frozen.kill()
        for mute in mutes:
            mute.close()


def _session_children(sshd_pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == sshd_pid:
                kids.append(int(entry))
    return kids


async def test_connection_killed_mid_run_reconnects(sshd: SshServer, running) -> None:
    node = msgspec.convert({"name": "gen-1", "host": "127.0.0.1", "port": sshd.port,
                            "user": sshd.user, "identity_file": str(sshd.client_key),
                            "known_hosts": str(sshd.known_hosts), "run_dir": str(running.run_dir),
                            "agent": AGENT, "connect_timeout_s": 30}, Node)
    seen: list[tuple[str, int]] = []
    states: list[str] = []
    link = AgentLink(node, on_snapshot=lambda n, s: seen.append(
        (link.state, ((msgspec.json.decode(s) if isinstance(s, bytes) else s).get("progress")
                      or {}).get("completed", 0))),
        on_state=lambda n, st, err: states.append(st))
    task = asyncio.create_task(link.run(max_backoff_s=1.0))

    async def until(cond: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, (states, seen[-3:])
            await asyncio.sleep(0.05)

    try:
        await until(lambda: len(seen) >= 2, 120)
        before = seen[-1][1]
        for pid in _session_children(sshd.proc.pid):
            os.kill(pid, 9)  # the SSH session dies under the console
        await until(lambda: "reconnecting" in states, 60)
        count = len(seen)
        await until(lambda: states[-1] == "connected" and len(seen) > count + 1, 120)
        assert seen[-1][1] > before, "the run kept going while the console was away"
    finally:
        await link.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_bootstrap_installs_the_agent_then_status_works(sshd: SshServer, running,
                                                        tmp_path: Path) -> None:
    venv = tmp_path / "node-home" / "fleetdeck-venv"
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, running.run_dir,
                               agent_cmd=f"{venv}/bin/fleetdeck-agent"))
    r = fleetdeck(fleet, "status")
    assert r.returncode == 3 and "did not answer hello" in r.stdout, r.stdout + r.stderr
    r = fleetdeck(fleet, "bootstrap", "gen-1", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (venv / "bin" / "fleetdeck-agent").exists()
    assert json.loads(r.stdout)["agent_version"]
    r = fleetdeck(fleet, "status", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["nodes"][0]["snapshot"]["run"] == "agent-test"


def test_no_known_hosts_file_is_an_unknown_host_not_an_unreachable_one(
        sshd: SshServer, running, tmp_path: Path) -> None:
    missing = tmp_path / "fresh-laptop" / "known_hosts"
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, running.run_dir, known_hosts=missing))
    r = fleetdeck(fleet, "status")
    assert r.returncode == 3 and "unknown host key SHA256:" in r.stdout, r.stdout
    r = fleetdeck(fleet, "--accept-new-host-key", "status")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"[127.0.0.1]:{sshd.port}" in missing.read_text()
    dead = tmp_path / "fleet-dead.toml"
    dead.write_text(node_toml("gone", sshd, running.run_dir, port=free_ports(1)[0],
                              known_hosts=tmp_path / "nope" / "known_hosts"))
    r = fleetdeck(dead, "--accept-new-host-key", "status")
    assert r.returncode == 3 and "no SSH answer" in r.stdout
