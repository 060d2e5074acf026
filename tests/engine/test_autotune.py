"""The auto-tuner finds each server's knee: against the simulator's model in simulated time
(three GPUs whose best concurrency is drawn at random, a sweep of fixed levels as the judge),
and against real simulator processes through a real engine and control.json."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.engine.autotune import KneeFinder, TuneSettings, reported_cap
from tests.engine.runs import start_engine, wait_progress, write_prompts, write_spec
from tests.engine.simgpu import SimGpu, tune

SWEEP = (2, 3, 4, 6, 8, 11, 16, 23, 32, 40, 48)
CAP = 48  # --max-running-requests of the simulated GPUs


def _seed() -> int:
    """A fresh seed each run (no constant passes), printed and replayable:
    FLEETDECK_TEST_SEED=N pytest ..."""
    given = os.environ.get("FLEETDECK_TEST_SEED")
    return int(given) if given else random.SystemRandom().randrange(1 << 30)


def test_auto_finds_the_knee_of_three_simulated_gpus() -> None:
    seed = _seed()
    rng = random.Random(seed)
    report = [f"seed {seed} (FLEETDECK_TEST_SEED={seed} replays it)"]
    bests = [round(rng.uniform(6, 64), 1) for _ in range(3)]
    if max(bests) - min(bests) < 12:  # three different knees, not three alike
        bests[0] = round(bests[1] + 20 if bests[1] < 40 else bests[1] - 20, 1)
    auto_total = best_total = 0.0
    for i, best in enumerate(bests):
        knee = round(rng.uniform(4, 32), 1)
        gpu = SimGpu(["--knee", str(knee), "--best-concurrency", str(best),
                      "--max-running-requests", str(CAP)], seed=rng.randrange(1 << 20))
        cap = gpu.reported_cap
        assert cap == CAP, f"/server_info reports {cap}, the simulator runs {CAP}"
        finder = KneeFinder(4, cap, gpu.now)
        run = tune(gpu, finder)
        where = (f"{report[0]}: GPU {i} (--knee {knee} --best-concurrency {best}): levels "
                 f"{run.levels}, curve "
                 f"{ {k: round(m.tok_per_s) for k, m in sorted(finder.curve.items())} }")
        assert run.settled is not None, f"never settled: {where}"
        assert run.steps_to_settle is not None and run.steps_to_settle <= 20, where
        assert max(run.levels) <= cap, f"above the server's max running requests: {where}"
        # Past the peak only latency grows: never settle more than 25% above it (the ceiling
        # is the best level when the peak lies beyond it).
        best_level = min(best, cap)
        assert run.settled <= 1.25 * best_level, f"settled {run.settled}: {where}"
        auto = gpu.throughput(run.settled)
        sweep = {level: gpu.throughput(level) for level in SWEEP}
        top = max(sweep, key=lambda k: sweep[k])
        report.append(f"GPU {i}: best {best}, auto settled {run.settled} in "
                      f"{run.steps_to_settle} steps: {auto:.0f} tok/s; best fixed {top}: "
                      f"{sweep[top]:.0f} tok/s")
        assert auto >= 0.9 * sweep[top], (f"auto {auto:.0f} tok/s < 0.9 x best fixed "
                                          f"{sweep[top]:.0f} (at {top}): {where}")
        auto_total += auto
        best_total += sweep[top]
    print("\n".join(report))
    assert auto_total >= 0.9 * best_total


def test_a_ceiling_below_the_knee_is_never_exceeded() -> None:
    gpu = SimGpu(["--knee", "200", "--best-concurrency", "300", "--max-running-requests", "12"])
    cap = gpu.reported_cap
    assert cap == 12
    finder = KneeFinder(40, cap, gpu.now)
    run = tune(gpu, finder, running=40)  # taken over at a level above the ceiling
    assert run.levels[:2] == [40, 12] and run.settled == 12, run.levels
    assert max(run.levels[1:]) <= 12


def test_restart_and_reprobe_find_a_moved_knee() -> None:
    gpu = SimGpu(["--knee", "8", "--best-concurrency", "10", "--max-running-requests", "64"])
    settings = TuneSettings(reprobe_s=120.0)
    finder = KneeFinder(4, 64, gpu.now, settings)
    first = tune(gpu, finder)
    assert first.settled is not None and first.settled <= 13, first.levels
    # The workload changes (shorter contexts, say): the knee moves up. Settled, the finder
    # sees it only when it probes again.
    gpu.model.cfg.best_concurrency = 48.0
    gpu.model.cfg.knee = 40.0
    levels: list[int] = []
    run = tune(gpu, finder, max_sim_s=settings.reprobe_s + 5)  # still settled: returns at once
    assert run.settled == first.settled
    t0 = gpu.now
    while gpu.now - t0 < settings.reprobe_s + 600 and (finder.level <= 16 or
                                                       finder.phase != "settled"):
        for started, tokens, latency in gpu.step():
            finder.answer(started, tokens, latency)
        want = finder.tick(gpu.now, len(gpu.in_flight), gpu.level, True)
        if want is not None:
            gpu.level = want
            levels.append(want)
    assert finder.phase == "settled" and finder.level > 16, (levels, finder.note)
    # A restart clears what was measured and searches again from where it is.
    level = finder.level
    assert finder.tick(gpu.now, 0, gpu.level, healthy=False) is None
    assert finder.tick(gpu.now + 1, 0, gpu.level, healthy=True) is None
    assert finder.phase == "measuring" and not finder.curve and finder.level == level
    assert finder.note is not None and "restarted" in finder.note


def test_a_reprobe_with_nothing_changed_comes_back_to_the_same_level() -> None:
    # Settled at the knee, it probes again (up, which loses; then down, which loses more)
    # and returns. A step down must be measured after the requests sent before it drained:
    # until then the server runs above the new level, which would flatter the lower level.
    gpu = SimGpu(["--knee", "24", "--best-concurrency", "24", "--max-running-requests", "64"])
    settings = TuneSettings(reprobe_s=300.0)
    finder = KneeFinder(4, 64, gpu.now, settings)
    first = tune(gpu, finder)
    assert first.settled is not None
    asked: list[int] = []
    t0 = gpu.now
    while gpu.now - t0 < settings.reprobe_s + 120:
        for started, tokens, latency in gpu.step():
            finder.answer(started, tokens, latency)
        want = finder.tick(gpu.now, len(gpu.in_flight), gpu.level, True)
        if want is not None:
            gpu.level = want
            asked.append(want)
    assert max(asked) > first.settled > min(asked), asked  # it probed both ways
    assert finder.phase == "settled" and finder.level == first.settled, (asked, finder.note)


def test_reported_cap_reads_both_server_info_shapes() -> None:
    assert reported_cap({"internal_states": [{"effective_max_running_requests_per_dp": 24},
                                             {"effective_max_running_requests_per_dp": 24}],
                         "max_running_requests": 64}) == 48
    assert reported_cap({"max_running_requests": 32, "internal_states": [{}]}) == 32
    assert reported_cap({"max_running_requests": None}) is None
    assert reported_cap("not json") is None


# -- through a real engine, real simulators and control.json ----------------------------------


def _audit(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "control.log.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], capture_output=True,
                          text=True, timeout=180)


def test_auto_through_control_json_and_a_manual_resize_wins(tmp_path: Path, sims: Any) -> None:
    # Server 0 keeps gaining up to its ceiling of 6; server 1's knee is about 8.
    # 1 simulated second = 0.3 s: a few dozen answers a second, light on a loaded machine.
    slow = ("--time-scale", "0.3", "--peak-tokens-per-s", "40")
    s0 = sims("--knee", "500", "--best-concurrency", "500", "--max-running-requests", "6",
              *slow)
    s1 = sims("--knee", "6", "--best-concurrency", "8", "--max-running-requests", "32", *slow)
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 20000)
    spec = write_spec(tmp_path / "run.toml", prompts, [s0.url, s1.url], max_tokens=96,
                      concurrency_per_server="auto", batch_size=500)
    engine = start_engine(spec)
    run_dir = engine.run_dir
    try:
        def tuned(p: dict[str, Any], n: str) -> dict[str, Any] | None:
            return p["servers"][n].get("autotune")

        p = wait_progress(engine, lambda p: (tuned(p, "0") or {}).get("phase") == "settled",
                          120, "server 0 settled")
        assert tuned(p, "0")["level"] == 6 and tuned(p, "0")["cap"] == 6
        assert p["servers"]["0"]["limit"] == 6
        autos = [a for a in _audit(run_dir) if a["who"] == "auto"]
        assert autos and all(a["method"] == "resize" for a in autos)
        assert max(a["params"]["value"] for a in autos if a["params"]["server"] == 0) == 6
        curve = tuned(p, "0")["curve"]
        assert [pt["concurrency"] for pt in curve] == sorted(pt["concurrency"] for pt in curve)
        assert curve[-1]["concurrency"] == 6

        # A person resizes server 1: auto is off there, and stays off.
        done = _agent("resize", str(run_dir), "3", "--server", "1")
        assert done.returncode == 0, done.stderr
        control = json.loads((run_dir / "control.json").read_text())
        assert control["concurrency"]["auto_servers"] == {"1": False}
        wait_progress(engine, lambda p: p["servers"]["1"]["limit"] == 3
                      and tuned(p, "1") is None, 120, "server 1 by hand")
        manual_rev = control["rev"]
        seen = len(_audit(run_dir))
        # The tuner keeps working on server 0 (it measures on), never on 1 again.
        before = wait_progress(engine, lambda p: p["control_rev"] >= manual_rev, 120,
                               "rev applied")["completed"]
        wait_progress(engine, lambda p: p["completed"] >= before + 150, 120, "150 more answers")
        assert not [a for a in _audit(run_dir)[seen:] if a["who"] == "auto"
                    and a["params"]["server"] == 1]
        assert json.loads((run_dir / "control.json").read_text())["concurrency"][
            "servers"]["1"] == 3

        # resize auto hands every server back; the audit trail says who did what.
        done = _agent("resize", str(run_dir), "auto")
        assert done.returncode == 0, done.stderr
        wait_progress(engine, lambda p: tuned(p, "1") is not None, 120, "server 1 auto again")
        revs = [json.loads((run_dir / "control.json").read_text())["rev"]]
        assert revs[0] > manual_rev
        people = [a for a in _audit(run_dir) if a["who"] != "auto"]
        assert [a["params"]["value"] for a in people] == [3, "auto"]
    finally:
        engine.kill()


@pytest.mark.parametrize("bad", ["fast", "-1", "1.5"])
def test_resize_takes_a_number_or_auto(tmp_path: Path, bad: str) -> None:
    out = _agent("resize", str(tmp_path), bad)
    assert out.returncode == 2 and "auto" in out.stderr
