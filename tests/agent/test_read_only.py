"""A key that can only look: `serve --stdio --read-only` as a forced command in authorized_keys,
through the real sshd. And the audit log's `who` comes from the node, never the client."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from tests.agent.rundirs import copy_run, finished_run, finished_work
from tests.agent.stdio import ROOT
from tests.hostile.conftest import tree
from tests.plugins.supervised import agent, wait_status
from tests.servers.sshd import SshServer

# Every method that changes something, with parameters that would be accepted otherwise.
MUTATING: list[tuple[str, dict[str, Any]]] = [
    ("resume", {}), ("launch", {}), ("stop", {"servers": True}), ("down", {}),
    ("restart_server", {"server": 0}), ("pause", {}), ("unpause", {}), ("resize", {"value": 1}),
    ("max_tokens", {"value": 1}), ("retry", {"what": "failed"}), ("manifest", {}),
]


def forced(run_dir: Path, *flags: str) -> str:
    """An authorized_keys options prefix that pins the key to one agent command."""
    cmd = (f"cd {ROOT} && PYTHONPATH={ROOT} exec {sys.executable} -m agents.cli serve --stdio "
           f"{' '.join(flags)} {run_dir}")
    return f'command="{cmd}",restrict'


class Rpc:
    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self.proc = proc
        self.next = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next += 1
        rid = self.next
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                          "params": params}).encode() + b"\n")
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
            assert line, "the agent closed the session"
            msg = json.loads(line)
            if msg.get("id") == rid:
                return msg


async def session(sshd: SshServer, key: Path, command: str = "ignored by a forced command"
                  ) -> tuple[asyncssh.SSHClientConnection, Rpc]:
    conn = await asyncssh.connect(sshd.host, port=sshd.port, username=sshd.user,
                                  client_keys=[str(key)], known_hosts=str(sshd.known_hosts),
                                  agent_path=None)
    proc = await conn.create_process(command, encoding=None)
    return conn, Rpc(proc)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_run(tmp_path_factory.mktemp("made"))


@pytest.fixture
def run_dir(made: Path, tmp_path: Path) -> Iterator[Path]:
    run = copy_run(made, tmp_path / "run")
    before = finished_work(run)
    yield run
    assert finished_work(run) == before, "finished work changed"


async def test_a_read_only_key_can_look_and_nothing_else(sshd: SshServer, run_dir: Path) -> None:
    key = sshd.add_key("oncall", forced(run_dir, "--read-only", "--who", "oncall-alice"))
    (run_dir / "logs" / "generate.log").write_text("hello from the engine\n")
    before = tree(run_dir)
    conn, rpc = await session(sshd, key, command="rm -rf /  # whatever the client asks")
    async with conn:
        assert (await rpc.call("hello", protocol=1))["result"]["supervised"] is False
        assert (await rpc.call("status"))["result"]["progress"]["completed"] == 40
        assert (await rpc.call("logs", name="generate"))["result"]["lines"] == [
            "hello from the engine"]
        assert len((await rpc.call("samples", n=3))["result"]["samples"]) == 3
        assert "items" in (await rpc.call("history"))["result"]
        assert (await rpc.call("failures"))["result"]["complete"] is True  # reads, writes nothing
        assert "checks" in (await rpc.call("verify"))["result"]
        for method, params in MUTATING:
            reply = await rpc.call(method, who="root@elsewhere", **params)
            assert "error" in reply, (method, reply)
            err = reply["error"]
            assert err["code"] == -32002 and "read-only" in err["message"], (method, err)
            assert method in err["message"]
        # The session is still there after every refusal.
        assert (await rpc.call("hello", protocol=1))["result"]["protocol"] == 1
    assert not (run_dir / "supervisor.pid").exists(), "a read-only session started a supervisor"
    assert tree(run_dir) == before, "a read-only session changed the run directory"


async def test_read_only_holds_against_a_live_supervisor(sshd: SshServer, supervised) -> None:
    run = supervised(1, prompts=3000, sim_args="--time-scale 1", concurrency_per_server=4)
    assert agent("up", str(run.spec)).returncode == 0
    await asyncio.to_thread(wait_status, run.run_dir, lambda s: s["status"] == "running", 120,
                            "running")
    control = (run.run_dir / "control.json").read_bytes()
    key = sshd.add_key("look", forced(run.run_dir, "--read-only"))
    conn, rpc = await session(sshd, key)
    async with conn:
        assert (await rpc.call("hello", protocol=1))["result"]["supervised"] is True
        assert (await rpc.call("status"))["result"]["source"] == "supervisor"
        for method, params in MUTATING:
            reply = await rpc.call(method, **params)
            assert reply.get("error", {}).get("code") == -32002, (method, reply)
        assert (await rpc.call("status"))["result"]["status"] == "running"
    assert (run.run_dir / "control.json").read_bytes() == control
    snap = await asyncio.to_thread(wait_status, run.run_dir, lambda s: True, 120, "status")
    assert snap["status"] == "running" and snap["servers"][0]["state"] == "healthy"


def _audit_who(run_dir: Path, method: str) -> list[str]:
    audit = [json.loads(x) for x in (run_dir / "control.log.jsonl").read_text().splitlines()]
    return [e["who"] for e in audit if e["method"] == method]


async def test_a_client_cannot_say_who_it_is_in_the_audit_log(sshd: SshServer,
                                                              run_dir: Path) -> None:
    conn, rpc = await session(sshd, sshd.client_key,
                              f"cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} -m agents.cli "
                              f"serve {run_dir} --stdio")
    async with conn:
        assert "result" in await rpc.call("pause", who="mallory")
    assert _audit_who(run_dir, "pause") == [f"{sshd.user}@127.0.0.1"]
    assert "mallory" not in (run_dir / "control.log.jsonl").read_text()


async def test_audit_who_is_the_forced_commands_who(sshd: SshServer, run_dir: Path) -> None:
    named = sshd.add_key("alice", forced(run_dir, "--who", "alice"))
    conn, rpc = await session(sshd, named)
    async with conn:
        assert "result" in await rpc.call("resize", value=5, who="mallory")
    assert _audit_who(run_dir, "resize") == ["alice"]
