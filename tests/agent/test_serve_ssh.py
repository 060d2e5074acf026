"""`fleetdeck-agent serve --stdio` over a real OpenSSH server: the console's path to a node."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from typing import Any

import asyncssh

from tests.plugins.supervised import agent, wait_status
from tests.servers.sshd import SshServer


class Session:
    """A JSON-RPC client on an SSH exec channel, keeping pushed notifications apart."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self.proc = proc
        self.next_id = 0
        self.notes: list[dict[str, Any]] = []

    async def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def read(self, timeout: float = 120) -> dict[str, Any]:
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        assert line, "the agent closed the session"
        return json.loads(line)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        rid = self.next_id
        await self.send_raw(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                        "params": params}).encode() + b"\n")
        while True:
            msg = await self.read()
            if msg.get("id") == rid:
                return msg
            self.notes.append(msg)

    async def notification(self, timeout: float = 60) -> dict[str, Any]:
        if self.notes:
            return self.notes.pop(0)
        msg = await self.read(timeout)
        assert "id" not in msg, msg
        return msg


async def _open(conn: asyncssh.SSHClientConnection, run_dir: str) -> Session:
    proc = await conn.create_process(f"{sys.executable} -m agents.cli serve {run_dir} --stdio",
                                     encoding=None)
    return Session(proc)


def _connect(sshd: SshServer) -> Any:
    return asyncssh.connect(sshd.host, port=sshd.port, username=sshd.user,
                            client_keys=[str(sshd.client_key)],
                            known_hosts=str(sshd.known_hosts), agent_path=None)


async def test_serve_over_ssh_with_a_live_supervisor(sshd: SshServer, supervised) -> None:
    run = supervised(1, prompts=3000, sim_args="--time-scale 1", concurrency_per_server=4)
    assert agent("up", str(run.spec)).returncode == 0
    await asyncio.to_thread(wait_status, run.run_dir, lambda s: s["status"] == "running", 120,
                            "running")
    big = run.run_dir / "logs" / "big.log"
    big.write_text("".join(f"{i:05d} " + "x" * 120 + "\n" for i in range(3000)))
    async with _connect(sshd) as conn:
        a = await _open(conn, str(run.run_dir))
        hello = await a.call("hello", protocol=1)
        assert hello["result"]["supervised"] is True and hello["result"]["protocol"] == 1
        first = await a.call("subscribe")
        assert first["result"]["source"] == "supervisor"
        stamps = []
        for _ in range(3):
            note = await a.notification()
            assert note["method"] == "status"
            stamps.append((time.monotonic(), note["params"]["updated_at"]))
        # One push per interval (1 s), never a burst; a loaded machine only stretches them.
        gaps = [b[1] - a_[1] for a_, b in itertools.pairwise(stamps)]
        assert all(0.5 < g < 15 for g in gaps), gaps
        # A second console at the same time.
        b = await _open(conn, str(run.run_dir))
        assert (await b.call("hello", protocol=1))["result"]["supervised"] is True
        assert (await b.call("status"))["result"]["run"] == "agent-test"
        # Live controls through the relay.
        assert "result" in await a.call("resize", value=6)
        assert "result" in await b.call("max_tokens", value=300)
        assert "result" in await a.call("pause")
        snap = await asyncio.to_thread(
            wait_status, run.run_dir, lambda s: s["progress"]["concurrency"] == 6
            and s["progress"]["max_tokens"] == 300 and s["status"] == "paused", 120, "applied")
        assert snap["progress"]["paused"]
        # Malformed lines get an error and the session goes on.
        await a.send_raw(b"this is not json\n")
        bad = await a.read()
        while "id" not in bad:
            bad = await a.read()
        assert bad["error"]["code"] == -32700
        assert (await a.call("no_such_method"))["error"]["code"] == -32601
        assert (await a.call("resize", value="lots"))["error"]["code"] == -32602
        assert (await a.call("hello", protocol=1))["result"]["protocol"] == 1
        # A protocol mismatch is a clear error, never a hang.
        mismatch = await b.call("hello", protocol=99)
        assert mismatch["error"]["code"] == -32003
        assert "fleetdeck bootstrap" in mismatch["error"]["message"]
        # A reply far over asyncio's 64 KiB default line limit.
        reply = await b.call("logs", name="big", n=3000)
        assert len(json.dumps(reply)) > 300_000 and len(reply["result"]["lines"]) == 3000
        refused = await b.call("logs", name="../../etc/passwd")
        assert refused["error"]["code"] == -32002
        a.proc.stdin.write_eof()
        b.proc.stdin.write_eof()
    audit = [json.loads(x) for x in (run.run_dir / "control.log.jsonl").read_text().splitlines()]
    relayed = [e for e in audit if e["method"] in ("resize", "max_tokens", "pause")]
    assert [e["method"] for e in relayed] == ["resize", "max_tokens", "pause"]
    assert all(e["who"].endswith("@127.0.0.1") for e in relayed), relayed


async def test_serve_without_a_supervisor_answers_from_disk(sshd: SshServer, supervised) -> None:
    run = supervised(1, prompts=30)
    assert agent("up", str(run.spec)).returncode == 0
    await asyncio.to_thread(wait_status, run.run_dir, lambda s: s["status"] == "done", 120,
                            "done")
    assert agent("down", str(run.run_dir), "--yes").returncode == 0
    await asyncio.to_thread(wait_status, run.run_dir, lambda s: s["source"] == "disk", 120,
                            "supervisor gone")
    async with _connect(sshd) as conn:
        s = await _open(conn, str(run.run_dir))
        assert (await s.call("hello", protocol=1))["result"]["supervised"] is False
        snap = (await s.call("status"))["result"]
        assert snap["source"] == "disk" and snap["progress"]["completed"] == 30
        assert snap["progress_age_s"] is not None
        assert (await s.call("stop"))["error"]["code"] == -32001
        assert "result" in await s.call("resize", value=3)
        samples = (await s.call("samples", n=3))["result"]["samples"]
        assert len(samples) == 3 and all("content_head" in x for x in samples)
    control = json.loads((run.run_dir / "control.json").read_text())
    assert control["concurrency"]["default"] == 3


async def test_subscriber_keeps_getting_status_after_the_supervisor_goes(sshd: SshServer,
                                                                         supervised) -> None:
    run = supervised(1, prompts=30)
    assert agent("up", str(run.spec)).returncode == 0
    await asyncio.to_thread(wait_status, run.run_dir, lambda s: s["status"] == "done", 120,
                            "done")
    async with _connect(sshd) as conn:
        s = await _open(conn, str(run.run_dir))
        assert (await s.call("subscribe"))["result"]["source"] == "supervisor"
        assert agent("down", str(run.run_dir), "--yes").returncode == 0
        for _ in range(40):
            note = await s.notification(timeout=60)
            if note["params"]["source"] == "disk":
                break
        else:
            raise AssertionError("no status from disk after the supervisor went")
        assert note["params"]["progress"]["completed"] == 30
        assert note["params"]["status"] == "done"
