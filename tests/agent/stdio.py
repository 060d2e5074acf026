"""Driving the real `fleetdeck-agent serve --stdio` process with request lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    code: int
    replies: list[dict[str, Any]]
    stderr: str

    def by_id(self, rid: int) -> dict[str, Any]:
        for r in self.replies:
            if r.get("id") == rid:
                return r
        raise AssertionError(f"no reply with id {rid}: {self.replies}")


def request(rid: int, method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                       "params": params}).encode() + b"\n"


def serve(run_dir: Path, *lines: bytes, args: tuple[str, ...] = (), timeout: float = 180,
          env: dict[str, str] | None = None) -> Served:
    """One `serve --stdio` session: send every line, close stdin, collect every reply."""
    proc = subprocess.run(
        [sys.executable, "-m", "agents.cli", "serve", str(run_dir), "--stdio", *args],
        input=b"".join(lines), capture_output=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    replies = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    return Served(proc.returncode, [r for r in replies if "id" in r],
                  proc.stderr.decode(errors="replace"))
