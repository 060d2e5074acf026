"""Hostile RPC lines, sent as a console's would travel: over the real sshd to the real
`fleetdeck-agent serve --stdio` on a finished run. Each row: the bad line gets a JSON-RPC
error naming the problem, the session goes on (a hello after it is answered), the agent exits
0 without a traceback, nothing in the run directory changes and no finished work is lost."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.rundirs import copy_run, finished_run, finished_work
from tests.hostile.conftest import ROOT, assert_only_changed, tree
from tests.servers.ports import kill_pid
from tests.servers.sshd import SshServer, start_sshd


def req(method: Any, rid: Any = 1, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                       "params": params}).encode()


def _agent_command(run_dir: Path, *flags: str) -> str:
    return (f"cd {shlex.quote(str(ROOT))} && PYTHONPATH={shlex.quote(str(ROOT))} exec "
            f"{shlex.quote(sys.executable)} -m agents.cli serve --stdio {' '.join(flags)} "
            f"{shlex.quote(str(run_dir))}")


def over_ssh(sshd: SshServer, key: Path, command: str, lines: list[bytes],
             timeout: float = 120) -> tuple[int, list[dict[str, Any]], str]:
    """Send the lines over a real `ssh` session; (exit code, replies, stderr)."""
    proc = subprocess.run(
        ["ssh", "-T", "-i", str(key), "-p", str(sshd.port), "-o", "BatchMode=yes",
         "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={sshd.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR",
         f"{sshd.user}@{sshd.host}", command],
        input=b"".join(x + b"\n" for x in lines), capture_output=True, timeout=timeout)
    replies = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    return proc.returncode, replies, proc.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def node() -> Iterator[SshServer]:
    with tempfile.TemporaryDirectory(prefix="fd-rpc-") as d:
        server = start_sshd(Path(d))
        try:
            yield server
        finally:
            kill_pid(server.proc)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_run(tmp_path_factory.mktemp("made"))


DEEP_ARRAYS = (b'{"jsonrpc": "2.0", "id": 1, "method": "status", "params": {"x": '
               + b"[" * 100_000 + b"]" * 100_000 + b"}}")
DEEP_OBJECTS = b'{"a": ' * 50_000 + b"1" + b"}" * 50_000

# (the line, read-only session?, the error code, what the message must name)
ROWS = [
    pytest.param(DEEP_ARRAYS, False, -32700, ["nested"], id="nested-100k-arrays"),
    pytest.param(DEEP_OBJECTS, False, -32700, ["nested"], id="nested-50k-objects"),
    pytest.param(b"hello there", False, -32700, ["not JSON"], id="not-json"),
    pytest.param(b"\xff\xfe" + req("status"), False, -32700, ["not JSON"], id="not-utf8"),
    pytest.param(b"[1, 2, 3]", False, -32600, ["jsonrpc"], id="array-not-object"),
    pytest.param(req(5), False, -32600, ["method"], id="method-not-a-string"),
    pytest.param(b'{"jsonrpc": "2.0", "id": 1, "method": "status", "params": [1]}', False,
                 -32602, ["params must be an object"], id="params-not-object"),
    pytest.param(req("rm_rf"), False, -32601, ["rm_rf"], id="unknown-method"),
    pytest.param(req("logs", name="./run.toml"), False, -32002, ["a path is refused",
                                                                  "generate"],
                 id="logs-run-toml-path"),
    pytest.param(req("logs", name="/etc/passwd"), False, -32002, ["absolute"],
                 id="logs-absolute"),
    pytest.param(req("logs", name="../../etc/shadow"), False, -32002, ["'..'"],
                 id="logs-dotdot"),
    pytest.param(req("logs", name={"x": 1}), False, -32602, ["name"], id="logs-name-object"),
    pytest.param(req("logs", name="generate", n=-5), False, -32602, ["n must be"],
                 id="logs-negative-n"),
    pytest.param(req("history", since="yesterday"), False, -32602, ["since"],
                 id="history-since-text"),
    pytest.param(req("manifest", path="../../etc"), False, -32002, ["'..'"],
                 id="manifest-path-escape"),
    pytest.param(req("resize", value="lots"), False, -32602, ["VALUE", "lots"],
                 id="resize-not-a-number"),
    pytest.param(req("resume"), True, -32002, ["read-only", "resume"], id="read-only-resume"),
    pytest.param(req("max_tokens", value=1), True, -32002, ["read-only", "max_tokens"],
                 id="read-only-max-tokens"),
    pytest.param(req("retry", what="failed"), True, -32002, ["read-only", "retry"],
                 id="read-only-retry"),
    pytest.param(req("launch", spec="/etc/passwd"), True, -32002, ["read-only", "launch"],
                 id="read-only-launch"),
]


@pytest.mark.parametrize(("line", "read_only", "code", "names"), ROWS)
def test_a_hostile_rpc_line(node: SshServer, made: Path, tmp_path: Path, line: bytes,
                            read_only: bool, code: int, names: list[str]) -> None:
    run_dir = copy_run(made, tmp_path / "run")
    work = finished_work(run_dir)
    before = tree(tmp_path)
    if read_only:
        key = node.add_key(f"ro-{tmp_path.name}",
                           f'command="{_agent_command(run_dir, "--read-only")}",restrict')
        command = "whatever the client asks"
    else:
        key, command = node.client_key, _agent_command(run_dir)
    hello = req("hello", rid=99, protocol=1)
    rc, replies, stderr = over_ssh(node, key, command, [line, hello])
    assert "Traceback" not in stderr and "Error:" not in stderr, stderr
    assert rc == 0, (rc, stderr)
    answers = [r for r in replies if r.get("id") != 99]
    assert len(answers) == 1, replies
    err = answers[0].get("error")
    assert err is not None and err["code"] == code, answers[0]
    for name in names:
        assert name in err["message"], (name, err["message"])
    assert next(r for r in replies if r.get("id") == 99)["result"]["protocol"] == 1
    assert "urls" not in json.dumps(replies)  # run.toml's contents are never served
    assert_only_changed(before, tree(tmp_path))
    assert finished_work(run_dir) == work
    assert not (run_dir / "supervisor.pid").exists()


def test_a_client_cannot_write_who_it_is_into_the_audit_log(node: SshServer, made: Path,
                                                            tmp_path: Path) -> None:
    run_dir = copy_run(made, tmp_path / "run")
    work = finished_work(run_dir)
    before = tree(tmp_path)
    rc, replies, stderr = over_ssh(node, node.client_key, _agent_command(run_dir),
                                   [req("pause", who="root@the-ceo's-laptop")])
    assert rc == 0 and "Traceback" not in stderr, stderr
    assert "result" in replies[0], replies
    audit = (run_dir / "control.log.jsonl").read_text()
    assert "the-ceo" not in audit and f'"who":"{node.user}@127.0.0.1"' in audit, audit
    assert_only_changed(before, tree(tmp_path), allowed=["run/control."])
    assert finished_work(run_dir) == work
