"""Acceptance drift judged from the history on disk (agents/supervise/acceptdrift.py): a
server against its own earlier level, which a supervisor restart does not reset, and a
fleet-wide decline against the run's first hours, named with its figures."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from agents.rundir.histstore import MAX_LIMIT, read_history
from agents.rundir.schema import ServerStatus
from agents.rundir.spec import AlertsSection
from agents.supervise.acceptdrift import accept_levels
from agents.supervise.alerts import AlertBook
from tests.agent.histories import STEP_S, write_history
from tests.agent.test_alerts import progress
from tests.plugins.supervised import agent, rpc_status, wait_status
from tests.servers.ports import wait_until

CFG = AlertsSection()  # the defaults: 0.7 of a server's own level, 0.7 of the fleet's
T0 = 1_700_000_000.0
FOUR_HOURS = int(4 * 3600 / STEP_S)


def judged(run: Path, now: float, accepts: dict[int, float]) -> dict[str, str]:
    """The alerts a book raises from this history, each server's live accept length given."""
    book = AlertBook(CFG, host="node-1")
    book.levels = accept_levels(read_history(run, "all", resolution=60, limit=MAX_LIMIT).items,
                                now, CFG)
    servers = [ServerStatus(number=n, url=f"http://x{n}", state="healthy",
                            accept_length_window=a) for n, a in accepts.items()]
    return {a.code: a.message for a in book.evaluate(progress(100), servers, None, now=now)}


def history_with_last(run: Path, last_20_min: dict[int, float], noise: float = 0.0) -> float:
    """Four hours at 3.0 (with a small wobble), the last 20 min at each server's figure; the
    time just after the newest sample."""
    recent_from = T0 + 4 * 3600 - 1200

    def accept(n: int, t: float) -> float:
        if t >= recent_from:
            return last_20_min[n]
        return 3.0 + noise * (1 if int(t / 60) % 2 else -1)

    samples = write_history(run / "history.jsonl", T0, FOUR_HOURS, servers=len(last_20_min),
                            accept=accept)
    return samples[-1]["updated_at"] + 5


def test_a_fleet_wide_decline_fires_naming_each_server_and_its_figures(tmp_path: Path) -> None:
    now = history_with_last(tmp_path, {0: 1.9, 1: 2.0, 2: 2.3})
    got = judged(tmp_path, now, {0: 1.9, 1: 2.0, 2: 2.3})
    msg = got["accept_drift"]
    # (1.9 + 2.0 + 2.3) / 3 = 2.07 against 3.00: 31% down.
    assert "fell 31% across the fleet: 2.07 over the last 20 min against 3.00 over the run's " \
           "first 2 h" in msg, msg
    assert "server 0 3.00 → 1.90, server 1 3.00 → 2.00, server 2 3.00 → 2.30" in msg, msg
    # Each server is also judged against its own level: 0 and 1 fell past 0.7 of it, 2 not.
    assert "its own 3.00 over the run's first 2 h" in got["accept_drop:0"]
    assert "accept_drop:1" in got and "accept_drop:2" not in got


def test_a_stable_fleet_or_a_small_decline_raises_nothing(tmp_path: Path) -> None:
    steady = tmp_path / "steady"
    steady.mkdir()
    now = history_with_last(steady, {0: 3.1, 1: 2.9}, noise=0.3)
    assert not {"accept_drift", "accept_drop:0", "accept_drop:1"} & \
        set(judged(steady, now, {0: 3.1, 1: 2.9}))
    small = tmp_path / "small"
    small.mkdir()
    now = history_with_last(small, {0: 2.4, 1: 2.4})  # 20% down: under the threshold
    assert not {"accept_drift", "accept_drop:0", "accept_drop:1"} & \
        set(judged(small, now, {0: 2.4, 1: 2.4}))


def test_a_short_history_falls_back_to_the_run_average(tmp_path: Path) -> None:
    # Five minutes of history: no baseline yet; the book's own average judges, as before.
    write_history(tmp_path / "history.jsonl", T0, 30, servers=2)
    got = judged(tmp_path, T0 + 300, {0: 3.0, 1: 1.0})
    assert "well below the run's average" in got["accept_drop:1"]
    assert "accept_drop:0" not in got and "accept_drift" not in got


def test_a_server_s_drop_survives_a_supervisor_restart(supervised) -> None:
    # The simulated servers now accept 1.5 tokens a step; the history on disk says they
    # accepted 3.0 over the run's first hours. A supervisor that kept its level in memory
    # alone would, once restarted, take 1.5 for the norm.
    run = supervised(2, prompts=200_000, sim_args="--accept-length 1.5 --time-scale 0.2")
    run.run_dir.mkdir(parents=True)
    start = time.time() - 3 * 3600
    write_history(run.run_dir / "history.jsonl", start, int((3 * 3600 - 1500) / STEP_S),
                  servers=2)
    assert agent("up", str(run.spec)).returncode == 0

    def dropped(snap: dict) -> bool:
        msgs = {a["code"]: a["message"] for a in snap.get("alerts") or []}
        return all("below its own 3.00 over the run's first 2 h" in msgs.get(f"accept_drop:{n}",
                                                                            "")
                   for n in (0, 1))

    first = wait_status(run.run_dir, dropped, 180, "accept_drop against the history")
    os.kill(first["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: rpc_status(run.run_dir)["source"] == "disk", 60, "the supervisor gone")
    r = agent("resume", str(run.run_dir))
    assert r.returncode == 0, r.stderr
    again = wait_status(run.run_dir, lambda s: s["source"] == "supervisor" and dropped(s),
                        180, "accept_drop again after the restart")
    assert again["supervisor_pid"] != first["supervisor_pid"]


def test_a_unicode_digit_server_key_in_the_history_is_no_crash(tmp_path: Path) -> None:
    """'²'.isdigit() holds but int('²') raises: a recorded key like it sorts after the numbers
    and the fleet is judged all the same."""
    now = history_with_last(tmp_path, {0: 1.9, 1: 2.0, 2: 2.3})
    path = tmp_path / "history.jsonl"
    path.write_text(path.read_text().replace('"2": {"url"', '"\\u00b2": {"url"'))
    got = judged(tmp_path, now, {0: 1.9, 1: 2.0})
    msg = got["accept_drift"]
    assert "server 0 3.00 → 1.90, server 1 3.00 → 2.00, server ² 3.00 → 2.30" in msg, msg
