"""Crash loops said plainly: the real supervisor over servers that cannot start (the simulator
given a flag it does not take, or made to die at load printing a recorded out-of-memory tail)
names the cause in status and in the alert, stops restarting after the same deterministic
cause twice in a row at start-up, and keeps the backoff for an out-of-memory."""

from __future__ import annotations

import itertools
import shlex
import sys
from pathlib import Path
from typing import Any

from tests.plugins.supervised import agent, rpc_status, wait_status
from tests.servers.ports import wait_until

TAILS = Path(__file__).resolve().parents[1] / "fixtures" / "crash_tails"
SIM = f"{shlex.quote(sys.executable)} -m agents.sim --port {{port}} --model-path {{model}}"
MARKER = "# fleetdeck: launching at "


def _server(snap: dict[str, Any]) -> dict[str, Any]:
    server: dict[str, Any] = snap["servers"][0]
    return server


def _alert(snap: dict[str, Any]) -> str:
    return next((a["message"] for a in snap["alerts"] if a["code"] == "server_down:0"), "")


def _launches(run_dir: Path) -> int:
    return (run_dir / "logs" / "sglang_gpu0.log").read_text().count(MARKER)


def test_a_typo_in_the_command_stops_the_restarts_and_says_why(supervised) -> None:
    run = supervised(1, prompts=50, command=f"{SIM} --time-scale 0.05 --enable-metrcs")
    r = agent("up", str(run.spec))
    assert r.returncode == 0, r.stderr
    snap = wait_status(run.run_dir, lambda s: s["servers"] and _server(s)["restarts_stopped"],
                       120, "restarts stopped")
    s = _server(snap)
    # One restart: the first failure could have been a fluke; the second says the same.
    assert s["state"] == "down" and s["restarts"] == 1 and _launches(run.run_dir) == 2
    assert s["exit_cause"] == "unknown_argument"
    assert s["last_error"].startswith("restarts stopped: the same unknown argument at start-up "
                                      "twice in a row (python -m agents.sim: error: "
                                      "unrecognized arguments: --enable-metrcs): fix [servers] "
                                      "command in run.toml")
    assert s["restarts_stopped"] in s["last_error"]
    assert _alert(snap) == f"server 0 (GPU 0) is down: {s['last_error']}"
    # It stays down: well past the backoff of another restart (0.3 s x 2), none came.
    seen = snap["updated_at"]
    later = wait_status(run.run_dir, lambda s: s["updated_at"] > seen + 3.0, 60, "3 s later")
    assert _server(later)["state"] == "down" and _server(later)["restarts"] == 1
    assert _launches(run.run_dir) == 2
    # restart-server tries again (the model put in place, say), and the count starts over.
    r = agent("restart-server", str(run.run_dir), "0", "--yes")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: _launches(run.run_dir) == 4 and (
        _server(rpc_status(run.run_dir))["restarts_stopped"] is not None), 120,
        "restart-server, one more automatic restart, and stopped again")
    again = _server(rpc_status(run.run_dir))
    assert again["restarts"] == 3 and again["exit_cause"] == "unknown_argument"


def test_out_of_memory_keeps_restarting_with_backoff_and_is_named(supervised) -> None:
    oom = TAILS / "rendered_sglang-0.5.23_cuda_oom_at_load.log"
    run = supervised(1, prompts=50, command=f"{SIM} --time-scale 0.05 --load-seconds 0.5 "
                                            f"--fail-start {shlex.quote(str(oom))}",
                     servers={"restart_backoff_s": 2.0, "max_restarts": 3})
    assert agent("up", str(run.spec)).returncode == 0
    starts: set[float] = set()
    named: list[str] = []

    def watch(s: dict[str, Any]) -> bool:
        if not s["servers"]:
            return False
        server = _server(s)
        if server["started_at"] is not None:
            starts.add(server["started_at"])
        if server["state"] == "down" and server["exit_cause"] == "out_of_memory":
            named.append(_alert(s))
        return bool(server["restarts"] == 3 and server["last_error"]
                    and server["last_error"].startswith("gave up"))

    snap = wait_status(run.run_dir, watch, 180, "3 restarts, then given up")
    s = _server(snap)
    # Never stopped for being deterministic: memory a dying predecessor holds comes back.
    assert s["restarts_stopped"] is None and s["exit_cause"] == "out_of_memory"
    assert s["last_error"].startswith("gave up after 3 restarts in a row; the last exit: out of "
                                      "memory: torch.OutOfMemoryError: CUDA out of memory. "
                                      "Tried to allocate 1.16 GiB.")
    # The backoff doubled: 2, 4, 8 s between starts, whatever a start itself took.
    times = sorted(starts)
    assert len(times) == 4 and _launches(run.run_dir) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= 2.0 * 2 ** i for i, gap in enumerate(gaps)), gaps
    # While it waited to restart, the alert named the cause.
    assert named and all(a.startswith("server 0 (GPU 0) is down: ") for a in named)
    assert any("exited with 1 at start-up: out of memory: torch.OutOfMemoryError: CUDA out of "
               "memory. Tried to allocate 1.16 GiB." in a for a in named), named
