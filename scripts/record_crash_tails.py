"""Record the log tails of SGLang start-ups that fail, as the real code prints them, for the
supervisor's crash-cause tests (tests/fixtures/crash_tails/, SOURCES.md there).

    .venv/bin/python scripts/record_crash_tails.py [--out DIR]

Runs in the real-server tier's environment (SGLang 0.5.23 on the CPU, tests/real/env.py; it
must be built). No server comes up: each SGLang launch below fails while reading its
arguments, before any scheduler starts (an unknown flag, model paths that hold no model), so
each costs the launcher's imports (10-20 s) and nothing more. Two causes cannot fail that
early: a port in use is recorded from the uvicorn and uvloop of the same environment, set up
with SGLang's own uvicorn log format and run as SGLang runs it (a uvicorn.Server on a taken
port); memory from the CPU torch of the same environment (an allocation it cannot make). A
CUDA out-of-memory needs a GPU: that sample is rendered by hand (SOURCES.md says so).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.real.env import find  # noqa: E402

OUT = REPO / "tests" / "fixtures" / "crash_tails"

PORT_IN_USE = """
import socket
from sglang.srt.utils.common import set_uvicorn_logging_configs
set_uvicorn_logging_configs()
import uvicorn
busy = socket.socket()
busy.bind(("127.0.0.1", 0))
busy.listen()
async def app(scope, receive, send):
    pass
uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=busy.getsockname()[1],
                              log_level="info", loop="uvloop")).run()
"""

CPU_ALLOC = """
import torch
torch.empty(2**50, dtype=torch.uint8)
"""


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    """The combined output of a command that must fail; its session is killed after it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.returncode == 0:
        raise RuntimeError(f"{cmd!r} succeeded: nothing to record")
    print(f"  exit status {proc.returncode}", file=sys.stderr)
    return out.decode(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    real = find()
    if real is None:
        print("the tier's environment is not built: python -m tests.real.env build",
              file=sys.stderr)
        return 1
    env = {**os.environ, **real.server_env()}
    py = str(real.python)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "empty_model").mkdir()
        launch = [py, "-m", "sglang.launch_server", "--host", "127.0.0.1",
                  "--port", str(free_port()), "--device", "cpu"]
        samples = {
            "sglang-0.5.23_unknown_argument.log":
                [*launch, "--model-path", str(real.model), "--enable-metrcs"],
            "sglang-0.5.23_model_path_missing.log":
                [*launch, "--model-path", "/models/Qwen3-8B"],
            "sglang-0.5.23_model_dir_empty.log":
                [*launch, "--model-path", str(work / "empty_model")],
            "sglang-0.5.23_repo_id_offline.log":
                [*launch, "--model-path", "Qwen/Qwen3-8B-Instrct"],
            "uvicorn-0.54_port_in_use.log": [py, "-c", PORT_IN_USE],
            "torch-2.13-cpu_alloc_failed.log": [py, "-c", CPU_ALLOC],
        }
        for name, cmd in samples.items():
            print(f"recording {name}", file=sys.stderr)
            (args.out / name).write_text(run(cmd, env, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
