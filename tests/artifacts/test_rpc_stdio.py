"""`manifest` and `verify` through `fleetdeck-agent serve --stdio`: the bytes a console sends
over SSH, to a real subprocess, with no supervisor running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents import PROTOCOL_VERSION
from agents.rpc.protocol import REFUSED
from tests.servers.s3 import S3Server


class StdioAgent:
    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agents.cli", "serve", str(run_dir), "--stdio"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **env})
        self.next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next_id,
                                          "method": method, "params": params or {}}).encode()
                              + b"\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            assert line, self.proc.stderr.read().decode() if self.proc.stderr else "closed"
            msg = json.loads(line)
            if msg.get("id") == self.next_id:
                return msg

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def test_serve_stdio_answers_manifest_and_verify(run_copy: Path, s3_env: S3Server) -> None:
    agent = StdioAgent(run_copy, s3_env.env())
    try:
        assert "result" in agent.call("hello", {"protocol": PROTOCOL_VERSION})
        first = agent.call("manifest", {"limit": 5})["result"]
        assert len(first["entries"]) == 5 and first["next_offset"] == 5
        seen = [e["path"] for e in first["entries"]]
        offset = first["next_offset"]
        while offset is not None:
            page = agent.call("manifest", {"offset": offset, "limit": 5000})["result"]
            seen += [e["path"] for e in page["entries"]]
            offset = page["next_offset"]
        assert len(seen) == first["total"] == len(set(seen))
        assert "completions/completions_000000.jsonl" in seen

        refused = agent.call("manifest", {"prefix": "../.."})
        assert refused["error"]["code"] == REFUSED and "'..' is refused" in \
            refused["error"]["message"]
        bad = agent.call("manifest", {"limit": "many"})
        assert bad["error"]["code"] == -32602  # invalid params; the session goes on

        report = agent.call("verify")["result"]
        assert report["ok"], report["problems"]
        assert report["counted"]["s3_objects"] == report["counted"]["closed_batches"] > 0
    finally:
        agent.close()


def test_serve_stdio_on_a_file_or_dev_null_says_what_it_needs(tmp_path: Path) -> None:
    """Run by hand with a file or /dev/null for stdio (the console runs it over SSH, with
    pipes): a clear refusal naming the stream, exit 2, not asyncio's traceback."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {}}\n')
    for stdin, stdout, name, what in (
            (requests, None, "stdin", "a regular file"),
            (Path(os.devnull), None, "stdin", "a character device that is not a terminal"),
            (None, tmp_path / "out.txt", "stdout", "a regular file")):
        with open(stdin or os.devnull, "rb") as i, open(stdout or os.devnull, "wb") as o:
            r = subprocess.run([sys.executable, "-m", "agents.cli", "serve", str(tmp_path),
                                "--stdio"], stdin=i if stdin else subprocess.PIPE,
                               stdout=o if stdout else subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=120)
        err = r.stderr.decode()
        assert r.returncode == 2, err
        assert f"{name} is {what}" in err and "Traceback" not in err, err
