"""A node whose agent says what the test wants: a fake `fleetdeck-agent` (the fleet file's
`agent` command, run by the real sshd) answering JSON-RPC from a scenario file, beside a real
RUN_DIR that the pull's data path (OpenSSH's sftp or asyncssh) really reads.

For the console's side of things: what it does with a hostile snapshot or manifest, or with a
pull killed halfway, without running an engine to make a run directory."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from tests.servers.sshd import SshServer

# `python FAKE SCENARIO serve RUN_DIR --stdio`: each request is answered from the scenario's
# `answers` (a result) or `errors` (a JSON-RPC error); `raw` lines are written as they are.
# Anything else is "method not found". `python FAKE SCENARIO send-files RUN_DIR` (pull's
# stream): a `send` string (base64) is written as it is, whatever was asked (with `hang`, the
# agent then stays alive and silent); a `send` object
# answers each file it names with its `data` (base64) and `head` (header fields over the
# honest ones), the others honestly; without `send`, the real agent's send-files answers.
FAKE_AGENT = r'''
import base64, json, os, sys
scenario = json.load(open(sys.argv[1]))
out = sys.stdout.buffer
if sys.argv[2] == "send-files" and isinstance(scenario.get("send"), str):
    sys.stdin.buffer.read()
    out.write(base64.b64decode(scenario["send"]))
    out.flush()
    if scenario.get("hang"):
        # Alive and silent, until its session ends (the console killed its ssh) or 2 min.
        import time
        parent, end = os.getppid(), time.monotonic() + 120
        while os.getppid() == parent and time.monotonic() < end:
            time.sleep(0.1)
    sys.exit(0)
if sys.argv[2] == "send-files" and isinstance(scenario.get("send"), dict):
    out.write(b"FLEETDECK-SEND 1\n")
    for i, line in enumerate(sys.stdin.buffer):
        req = json.loads(line)
        fake = scenario["send"].get(req["path"])
        if fake is None:
            with open(os.path.join(sys.argv[3], req["path"]), "rb") as f:
                f.seek(req["offset"])
                data = f.read(req["length"])
            head = {}
        else:
            data, head = base64.b64decode(fake.get("data", "")), fake.get("head", {})
        out.write(json.dumps({"i": i, "n": len(data), **head}).encode() + b"\n" + data)
        out.flush()
    sys.exit(0)
if sys.argv[2] == "send-files":
    sys.path.insert(0, ROOT)
    from agents.artifacts.send import serve
    from pathlib import Path
    sys.exit(serve(Path(sys.argv[3]), sys.stdin.buffer, out.fileno()))
'''.replace("ROOT", repr(str(Path(__file__).resolve().parents[2]))) + r'''
for line in sys.stdin.buffer:
    req = json.loads(line)
    rid, method = req.get("id"), req.get("method")
    if rid is None:
        continue
    if method in scenario.get("raw", {}):
        out.write(scenario["raw"][method].encode("utf-8", "surrogateescape") + b"\n")
    elif method in scenario.get("errors", {}):
        out.write(json.dumps({"jsonrpc": "2.0", "id": rid,
                              "error": scenario["errors"][method]}).encode() + b"\n")
    elif method in scenario.get("answers", {}):
        out.write(json.dumps({"jsonrpc": "2.0", "id": rid,
                              "result": scenario["answers"][method]}).encode() + b"\n")
    else:
        out.write(json.dumps({"jsonrpc": "2.0", "id": rid, "error": {
            "code": -32601, "message": "unknown method " + repr(method)}}).encode() + b"\n")
    out.flush()
'''

HELLO = {"protocol": 1, "agent_version": "0.1.0", "host": "node", "run_dir": "/x",
         "supervised": False}


def entry(path: str, data: bytes = b"", **kw: Any) -> dict[str, Any]:
    """A manifest entry for `data`; any field may be given instead (size, sha256, refused)."""
    e: dict[str, Any] = {
        "path": path, "kind": "other", "size": len(data), "mtime": 0.0, "mtime_ns": 0,
        "sha256": hashlib.sha256(data).hexdigest(), "sha256_from": "read", "in_s3": False,
        "refused": None}
    e.update(kw)
    return e


def page(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"entries": list(entries), "total": len(entries), "next_offset": None}


def snapshot(**kw: Any) -> dict[str, Any]:
    """A finished generation run's snapshot, as the console's tests write them."""
    from tests.console.data import generate_snapshot

    return generate_snapshot(**{"status": "done", "source": "disk", "servers": [],
                                "alerts": [], **kw})


class FakeNode:
    """Node `gen-1` of a fleet file: the fake agent over the real sshd, and its RUN_DIR."""

    def __init__(self, sshd: SshServer, folder: Path, pulls: Path) -> None:
        self.run_dir = folder / "node-run"
        self.run_dir.mkdir(parents=True)
        self.scenario = folder / "scenario.json"
        self.pulls = pulls
        script = folder / "fake_agent.py"
        script.write_text(FAKE_AGENT)
        self.fleet = folder / "fleet.toml"
        self.fleet.write_text("\n".join([
            "[console]", f'pull_dir = "{pulls}"', "", "[[nodes]]", 'name = "gen-1"',
            'host = "127.0.0.1"', f"port = {sshd.port}", f'user = "{sshd.user}"',
            f'identity_file = "{sshd.client_key}"', f'known_hosts = "{sshd.known_hosts}"',
            f'run_dir = "{self.run_dir}"',
            f'agent = "{sys.executable} {script} {self.scenario}"',
            "connect_timeout_s = 30", ""]))
        self.answer()

    def answer(self, answers: dict[str, Any] | None = None, **extra: Any) -> None:
        body = {"answers": {"hello": HELLO, **(answers or {})}, **extra}
        self.scenario.write_text(json.dumps(body))

    def put(self, rel: str, data: bytes) -> bytes:
        path = self.run_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data
