"""An agent whose stdout is not the protocol (a login banner, a stray print) is named at once,
with its line escaped, instead of every call waiting out its timeout."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from console.transport import HELLO_TIMEOUT_S


def test_a_line_that_is_not_json_rpc_fails_the_call_at_once(tmp_path: Path) -> None:
    agent = tmp_path / "noisy-agent"
    # Reads the hello, answers with a banner (an ESC in it), then stays silent and open.
    agent.write_text("#!/bin/sh\nread line\nprintf 'Welcome to \\033[2Jgpu-box-7\\n'\n"
                     "exec sleep 600\n")
    agent.chmod(0o755)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'[[nodes]]\nname = "gen-1"\nlocal = true\nrun_dir = "{tmp_path}/r"\n'
                     f'agent = "{agent}"\n')
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet), "status",
                        "gen-1"], capture_output=True, text=True, timeout=3 * HELLO_TIMEOUT_S)
    took = time.monotonic() - started
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "not JSON-RPC: Welcome to \\x1b[2Jgpu-box-7" in out
    assert "\x1b" not in out
    assert took < HELLO_TIMEOUT_S, f"took {took:.1f} s: the call waited for its timeout"
