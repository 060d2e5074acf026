"""The decommission checklist says what is true (issue 11, item 14): advice is never counted as
a missing file ("31 of 30 missing or different"), a live run's passing verify is called live,
and files that mean something only while the supervisor lives (agent.sock.path,
supervisor.pid) are not artifacts: not in the manifest, so never in the pull set."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.artifacts.manifest import Manifest
from tests.console.data import generate_snapshot, server
from tests.hostile.conftest import run_cli
from tests.servers.sshd import SshServer

# A node whose agent answers from a scenario file (`python FAKE SCENARIO serve RUN_DIR
# --stdio`), reached through the real sshd: the console's checklist sees exactly these answers.
FAKE_AGENT = r'''
import json, sys
scenario = json.load(open(sys.argv[1]))
for line in sys.stdin:
    req = json.loads(line)
    if req.get("id") is None:
        continue
    result = scenario.get(req["method"])
    reply = {"jsonrpc": "2.0", "id": req["id"]}
    if result is None:
        reply["error"] = {"code": -32601, "message": "unknown method " + req["method"]}
    else:
        reply["result"] = result
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
'''
HELLO = {"protocol": 1, "agent_version": "0.1.0", "host": "node", "run_dir": "/x",
         "supervised": False}


def entry(path: str, data: bytes, **kw: Any) -> dict[str, Any]:
    return {"path": path, "kind": "other", "size": len(data), "mtime": 0.0, "mtime_ns": 0,
            "sha256": hashlib.sha256(data).hexdigest(), "sha256_from": "read",
            "in_s3": False, "refused": None, **kw}


def page(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"entries": list(entries), "total": len(entries), "next_offset": None}


def snapshot(**kw: Any) -> dict[str, Any]:
    return generate_snapshot(**{"servers": [], "alerts": [], **kw})


class FakeNode:
    def __init__(self, sshd: SshServer, folder: Path) -> None:
        self.run_dir = folder / "node-run"
        self.run_dir.mkdir()
        self.scenario = folder / "scenario.json"
        script = folder / "fake_agent.py"
        script.write_text(FAKE_AGENT)
        self.fleet = folder / "fleet.toml"
        self.fleet.write_text("\n".join([
            "[console]", f'pull_dir = "{folder / "pulls"}"', "", "[[nodes]]",
            'name = "gen-1"', 'host = "127.0.0.1"', f"port = {sshd.port}",
            f'user = "{sshd.user}"', f'identity_file = "{sshd.client_key}"',
            f'known_hosts = "{sshd.known_hosts}"', f'run_dir = "{self.run_dir}"',
            f'agent = "{sys.executable} {script} {self.scenario}"', "connect_timeout_s = 30",
            ""]))

    def answer(self, answers: dict[str, Any]) -> None:
        self.scenario.write_text(json.dumps({"hello": HELLO, **answers}))

    def put(self, rel: str, data: bytes) -> bytes:
        path = self.run_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data


def test_runtime_files_are_not_artifacts(run_copy: Path) -> None:
    (run_copy / "agent.sock.path").write_text("/tmp/fleetdeck-0/abc.sock\n")
    (run_copy / "supervisor.pid").write_text("4242\n")
    (run_copy / "logs" / "agent.sock.path").write_text("not at the top: an ordinary file\n")
    paths = {e.path for e in Manifest(run_copy).entries()}
    assert "agent.sock.path" not in paths and "supervisor.pid" not in paths
    assert "logs/agent.sock.path" in paths and "progress.json" in paths


@pytest.fixture
def node(sshd: SshServer, tmp_path: Path) -> FakeNode:
    return FakeNode(sshd, tmp_path)


def _check(node: FakeNode) -> dict:  # type: ignore[type-arg]
    out = run_cli("fleetdeck", "--fleet", node.fleet, "decommission-check", "gen-1", "--json",
                  env={"HOME": str(node.run_dir.parent)})
    assert "Traceback" not in out.text, out.text
    assert out.code == 1, out.text
    result = json.loads(out.stdout)
    return {item["name"]: item for item in result["items"]}


def test_the_servers_up_advice_is_not_counted_as_a_missing_file(node: FakeNode) -> None:
    logs = [entry(f"logs/sglang_gpu{i}.log", node.put(f"logs/sglang_gpu{i}.log", b"x" * i),
                  kind="log") for i in range(30)]
    live = snapshot(status="running", source="supervisor", servers=[server(0)])
    assert any(s["state"] == "healthy" for s in live["servers"])
    node.answer({"status": live, "manifest": page(*logs),
                 "verify": {"ok": True, "problems": [], "checks": []}})
    pulled = _check(node)["artifacts pulled"]
    assert "30 of 30 missing or different" in pulled["detail"], pulled
    assert "the servers are still up" in pulled["detail"]
    assert len(pulled["missing"]) == 30
    assert all(m.startswith("logs/") for m in pulled["missing"])


def test_a_live_runs_passing_verify_is_called_live(node: FakeNode) -> None:
    data = node.put("progress.json", b"{}")
    live_check = {"name": "live", "ok": True, "detail": "the run is running (engine pid 7): "
                  "judged on what is committed; in flight: 12 lines written, not yet "
                  "recorded; verify again once it is done or stopped"}
    node.answer({"status": snapshot(status="running", source="disk"),
                 "manifest": page(entry("progress.json", data, kind="state")),
                 "verify": {"ok": True, "problems": [], "checks": [live_check]}})
    items = _check(node)
    assert items["verify (S3 and counts)"]["ok"]
    assert "the run is running" in items["verify (S3 and counts)"]["detail"]
    assert "12 lines written, not yet recorded" in items["verify (S3 and counts)"]["detail"]
    assert not items["run finished"]["ok"]  # the gate stays shut: live is not finished
