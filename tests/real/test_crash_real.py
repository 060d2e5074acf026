"""A crash loop as the real SGLang 0.5.23 makes one: the supervisor launches the real launcher
with a typo in its command. It exits at its argument parser (no scheduler starts, no model
loads: the cost is its imports, twice), and the supervisor names the cause from the real
log and stops after the second identical start-up failure."""

from __future__ import annotations

import shlex

import pytest

from tests.plugins.supervised import agent, wait_status
from tests.real.env import RealEnv

pytestmark = pytest.mark.timeout(600)


def test_the_real_launcher_with_an_unknown_flag_stops_after_two_starts(
        supervised, real_env: RealEnv) -> None:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in real_env.server_env().items())
    command = (f"env {env} {shlex.quote(str(real_env.python))} -m sglang.launch_server "
               "--model-path {model} --host 127.0.0.1 --port {port} --device cpu "
               "--enable-metrcs")
    run = supervised(1, prompts=20, command=command)
    r = agent("up", str(run.spec))
    assert r.returncode == 0, r.stderr
    snap = wait_status(run.run_dir, lambda s: s["servers"] and s["servers"][0]["restarts_stopped"],
                       400, "restarts stopped")
    s = snap["servers"][0]
    assert s["state"] == "down" and s["restarts"] == 1 and s["exit_cause"] == "unknown_argument"
    assert ("at start-up twice in a row (sglang serve: error: unrecognized arguments: "
            "--enable-metrcs)") in s["last_error"], s["last_error"]
    log = (run.run_dir / "logs" / "sglang_gpu0.log").read_text()
    assert log.count("# fleetdeck: launching at ") == 2
    assert log.count("sglang serve: error: unrecognized arguments: --enable-metrcs") == 2
    alert = next(a["message"] for a in snap["alerts"] if a["code"] == "server_down:0")
    assert "restarts stopped" in alert and "--enable-metrcs" in alert
