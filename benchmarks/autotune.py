"""Auto-tune: output tokens/s with `concurrency_per_server = "auto"` against the best fixed
level (found by a sweep of fixed levels on the same GPU) and against the default (40).

1. Simulated time: GPUs whose knee and best concurrency are drawn at random, each the
   simulator's own model (agents/sim/model.py, set by --knee / --best-concurrency /
   --max-running-requests) on a fake clock. For each: the level auto settles at and how many
   steps and simulated minutes it took; tokens/s at that level, at the sweep's best level and
   at 40; and over a whole simulated hour that starts from scratch (auto's probing included).
2. Live (--live): a real engine (`fleetdeck-agent generate`) against three simulator
   processes with different knees, three runs of the same prompts: every server at 40, every
   server at its own best level (resize per server), and auto. Tokens/s from progress.json over
   the same window of each run. Wall-clock: on a loaded machine the figures move a few %.
3. Real (--real): SGLang itself (the real-server tier's CPU build, tests/real/), one server:
   a supervised run (`fleetdeck-agent up`, `[servers] urls`: the supervisor hands the
   server's own figures to the tuner) at each fixed level of --sweep, then one with auto,
   each of the same --real-prompts prompts to its end, tokens/s over each whole run (auto's
   probing included); auto's ratio to the best fixed level. --url takes a server already
   running; without it one is started (KV pool 65,536 tokens, one to five minutes). A CPU's
   pace is not a GPU's: the levels that matter are small, and the figures swing with the
   machine's load.

Baselines (best fixed, default) are measured in the same run. Target: auto >= 0.9 x best fixed.

    .venv/bin/python benchmarks/autotune.py [--gpus 12] [--seed 1] [--hour-s 3600] [--live]
        [--live-s 120]
        [--real [--url URL] [--sweep 2,4,8,16] [--real-prompts 400] [--real-max-tokens 16]]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.engine.autotune import KneeFinder  # noqa: E402
from agents.rundir.spec import AUTO_START  # noqa: E402
from tests.engine.runs import start_engine, write_prompts, write_spec  # noqa: E402
from tests.engine.simgpu import SimGpu, tune  # noqa: E402
from tests.servers.ports import kill_pid, wait_until  # noqa: E402
from tests.simserver import start_sim  # noqa: E402

SWEEP = (2, 3, 4, 6, 8, 11, 16, 23, 32, 40, 48, 64)
DEFAULT = 40


def hour_of(gpu: SimGpu, finder: KneeFinder | None, level: int, seconds: float) -> float:
    """Tokens/s over `seconds` of simulated time from a cold start: at a fixed level, or with
    the finder choosing (probing included)."""
    gpu.level = level if finder is None else finder.level
    gpu.model.take_window()
    t0 = gpu.now
    while gpu.now - t0 < seconds:
        for started, tokens, latency in gpu.step():
            if finder is not None:
                finder.answer(started, tokens, latency)
        if finder is not None:
            want = finder.tick(gpu.now, len(gpu.in_flight), gpu.level, True)
            if want is not None:
                gpu.level = want
    return gpu.model.take_window().gen_throughput


def simulated(n: int, seed: int, cap: int, hour_s: float = 3600.0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        best = round(rng.uniform(6, 80), 1)
        knee = round(rng.uniform(4, 40), 1)
        flags = ["--knee", str(knee), "--best-concurrency", str(best),
                 "--max-running-requests", str(cap)]
        gpu_seed = rng.randrange(1 << 20)
        gpu = SimGpu(flags, seed=gpu_seed)
        reported = gpu.reported_cap or cap
        finder = KneeFinder(AUTO_START, reported, gpu.now)
        run = tune(gpu, finder)
        settled = run.settled or finder.level
        auto = gpu.throughput(settled)
        sweep = {lv: gpu.throughput(lv) for lv in SWEEP if lv <= reported}
        top = max(sweep, key=lambda k: sweep[k])
        default = gpu.throughput(min(DEFAULT, reported))
        hour = {name: hour_of(SimGpu(flags, seed=gpu_seed), f, lv, hour_s)
                for name, f, lv in (("auto", KneeFinder(AUTO_START, reported, 0.0), 0),
                                    ("best", None, top), ("default", None, DEFAULT))}
        rows.append({"gpu": i, "knee": knee, "best_concurrency": best, "settled": settled,
                     "steps": run.steps_to_settle, "settle_min": run.sim_seconds / 60,
                     "best_fixed": top, "auto": auto, "best": sweep[top], "default": default,
                     "hour": hour, "hour_s": hour_s})
    return rows


def print_simulated(rows: list[dict[str, Any]]) -> None:
    print("1. simulated time (the simulator's model on a fake clock; --max-running-requests "
          f"{CAP})")
    print(f"{'gpu':>3} {'knee':>5} {'best':>5} | {'auto':>4} {'steps':>5} {'min':>5} | "
          f"{'fixed':>5} | {'auto/best':>9} {'auto/40':>7} | hour: {'auto/best':>9} "
          f"{'auto/40':>7}")
    for r in rows:
        h = r["hour"]
        print(f"{r['gpu']:>3} {r['knee']:>5} {r['best_concurrency']:>5} | {r['settled']:>4} "
              f"{r['steps'] or '-':>5} {r['settle_min']:>5.1f} | {r['best_fixed']:>5} | "
              f"{r['auto'] / r['best']:>9.3f} {r['auto'] / r['default']:>7.3f} | "
              f"      {h['auto'] / h['best']:>9.3f} {h['auto'] / h['default']:>7.3f}")
    ratio = [r["auto"] / r["best"] for r in rows]
    hour = [r["hour"]["auto"] / r["hour"]["best"] for r in rows]
    total = sum(r["auto"] for r in rows) / sum(r["best"] for r in rows)
    vs_default = sum(r["auto"] for r in rows) / sum(r["default"] for r in rows)
    print(f"settled auto / best fixed: fleet {total:.3f}, worst GPU {min(ratio):.3f}, median "
          f"{statistics.median(ratio):.3f}; auto / default 40: fleet {vs_default:.3f}")
    span = rows[0]["hour_s"]
    span_text = "a whole hour" if span == 3600 else f"{span / 60:g} simulated min"
    print(f"{span_text} from cold (probing included): auto / best fixed: worst "
          f"{min(hour):.3f}, median {statistics.median(hour):.3f}")
    print(f"steps to settle: max {max(r['steps'] or 0 for r in rows)}, simulated minutes: max "
          f"{max(r['settle_min'] for r in rows):.1f}")


# -- live ---------------------------------------------------------------------------------------

LIVE_GPUS = ({"knee": 8, "best": 10}, {"knee": 16, "best": 28}, {"knee": 30, "best": 60})


def live_run(tmp: Path, name: str, urls: list[str], concurrency: int | str,
             per_server: dict[int, int] | None, seconds: float, prompts: Path) -> float:
    folder = tmp / name
    folder.mkdir()
    spec = write_spec(folder / "run.toml", prompts, urls, max_tokens=256,
                      concurrency_per_server=concurrency, batch_size=1000,
                      max_concurrency=128)
    engine = start_engine(spec, env={"FLEETDECK_PROGRESS_INTERVAL_S": "1"})
    try:
        wait_until(lambda: engine.progress() is not None, 60, "progress.json")
        if per_server:
            import subprocess
            for server, level in per_server.items():
                subprocess.run([sys.executable, "-m", "agents.cli", "resize",
                                str(engine.run_dir), str(level), "--server", str(server)],
                               check=True, capture_output=True)
        start = time.monotonic()
        wait_until(lambda: time.monotonic() - start >= seconds * 0.25, seconds, "warm-up")
        p0 = engine.progress() or {}
        t0 = time.monotonic()
        wait_until(lambda: time.monotonic() - start >= seconds, seconds * 2, "the window")
        p1 = engine.progress() or {}
        rate = (p1["total_output_tokens"] - p0["total_output_tokens"]) / (time.monotonic() - t0)
        levels = {k: (v.get("autotune") or {}).get("level", v["limit"])
                  for k, v in p1["servers"].items()}
        print(f"  {name:<8} tokens/s {rate:8.0f}   levels {levels}", flush=True)
        return rate
    finally:
        engine.kill()


def live(seconds: float) -> None:
    print(f"\n2. live: a real engine, three simulator processes, {seconds:.0f} s a run "
          "(tokens/s over the last 75%)")
    with tempfile.TemporaryDirectory(prefix="fd-autotune-") as d:
        tmp = Path(d)
        sims = []
        try:
            for i, g in enumerate(LIVE_GPUS):
                folder = tmp / f"sim{i}"
                folder.mkdir()
                sims.append(start_sim(folder, "--time-scale", "0.25", "--load-seconds", "0",
                                      "--peak-tokens-per-s", "60", "--knee", str(g["knee"]),
                                      "--best-concurrency", str(g["best"]),
                                      "--max-running-requests", "64"))
            prompts = tmp / "prompts.jsonl"
            write_prompts(prompts, 200_000)
            urls = [s.url for s in sims]
            default = live_run(tmp, "default", urls, DEFAULT, None, seconds, prompts)
            best = live_run(tmp, "best", urls, DEFAULT,
                            {i: g["best"] for i, g in enumerate(LIVE_GPUS)}, seconds, prompts)
            auto = live_run(tmp, "auto", urls, "auto", None, seconds, prompts)
            print(f"auto / best fixed {auto / best:.3f}; auto / default 40 {auto / default:.3f}")
        finally:
            for s in sims:
                kill_pid(s.proc)


# -- real ---------------------------------------------------------------------------------------

REAL_WORDS, REAL_MAX_CONCURRENCY = 6, 64


def real_run(tmp: Path, name: str, url: str, concurrency: int | str, prompts: int,
             max_tokens: int) -> float:
    """One supervised run of `prompts` prompts on the real server, to its end: output tokens
    over the engine's own elapsed time (its start-up and ramp included, for every run)."""
    from tests.plugins.supervised import agent, kill_run
    from tests.real.wordprompts import write_word_prompts

    folder = tmp / name.replace(" ", "")
    folder.mkdir()
    write_word_prompts(folder / "prompts.jsonl", prompts, REAL_WORDS, seed=1)
    lines = ["[run]", 'name = "bench"', 'dir = "run"', "", "[servers]",
             f"urls = {json.dumps([url])}", "health_interval_s = 1", "", "[generate]",
             'prompts = "prompts.jsonl"', f"max_tokens = {max_tokens}",
             f"concurrency_per_server = {json.dumps(concurrency)}", "batch_size = 1000",
             f"max_concurrency = {REAL_MAX_CONCURRENCY}", "request_timeout_s = 600.0"]
    spec = folder / "run.toml"
    spec.write_text("\n".join(lines) + "\n")
    run_dir = folder / "run"

    def progress() -> dict[str, Any]:
        try:
            return dict(json.loads((run_dir / "progress.json").read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    try:
        started = time.monotonic()
        r = agent("up", str(spec))
        if r.returncode != 0:
            raise SystemExit(f"{name}: fleetdeck-agent up failed: {r.stdout}{r.stderr}")
        wait_until(lambda: progress().get("status") in ("done", "failed", "stopped"),
                   3600, f"{name}: its {prompts} prompts")
        p = progress()
        if p["status"] != "done":
            raise SystemExit(f"{name}: the run ended {p['status']}: {p.get('message')}")
        # The engine's elapsed_hours is rounded: a short run on an idle box reads 0 (a rate of
        # 6.4e10 tok/s once); from the first answer's wait to the end, timed here, instead.
        rate = p["total_output_tokens"] / max(time.monotonic() - started, 1e-3)
        tune = (p["servers"].get("0") or {}).get("autotune") or {}
        how = (f"level {tune.get('level')} ({tune.get('phase')}: {tune.get('note')})" if tune
               else f"level {concurrency}")
        print(f"  {name:<9}: {rate:8.1f} tok/s   {how}", flush=True)
        return float(rate)
    finally:
        agent("down", str(run_dir), "--yes")
        kill_run(run_dir)


def real(url: str | None, sweep: list[int], prompts: int, max_tokens: int) -> None:
    print(f"\n3. real: SGLang on this machine's CPU, fixed levels {sweep} and auto, {prompts} "
          f"prompts of {max_tokens} tokens a run (tokens/s over each whole run)")
    with tempfile.TemporaryDirectory(prefix="fd-autotune-real-") as d:
        tmp = Path(d)
        started = None
        try:
            if url is None:
                from tests.real.env import build
                from tests.real.server import start_server

                started = start_server(build(), tmp / "server", max_total_tokens=65536)
                print(f"  (a server started for this: ready after {started.wait_ready():.0f} s)")
                url = started.url
            fixed = {lv: real_run(tmp, f"fixed {lv:>3}", url, lv, prompts, max_tokens)
                     for lv in sweep}
            auto = real_run(tmp, "auto", url, "auto", prompts, max_tokens)
            top = max(fixed, key=lambda k: fixed[k])
            print(f"auto / best fixed ({top}): {auto / fixed[top]:.3f}" if fixed[top] > 0 else
                  "auto / best fixed: no throughput at any fixed level")
        finally:
            if started is not None:
                started.kill()


CAP = 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hour-s", type=float, default=3600.0,
                    help="simulated seconds of the run from cold (the tests shrink it)")
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--live-s", type=float, default=120.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--real", action="store_true", help="also against SGLang itself")
    ap.add_argument("--url", default=None, help="--real: a running server (else one is started)")
    ap.add_argument("--sweep", default="2,4,8,16", help="--real: the fixed levels")
    ap.add_argument("--real-prompts", type=int, default=400, help="--real: prompts a run")
    ap.add_argument("--real-max-tokens", type=int, default=16, help="--real: max_tokens")
    args = ap.parse_args()
    rows = simulated(args.gpus, args.seed, CAP, args.hour_s)
    if rows:
        print_simulated(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.live:
        live(args.live_s)
    if args.real:
        try:
            sweep = [int(x) for x in args.sweep.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--sweep: levels separated by commas, not {args.sweep!r}")
        if not sweep or min(sweep) < 1:
            ap.error(f"--sweep: at least one level, each 1 or more, not {args.sweep!r}")
        if args.real_prompts < 1 or args.real_max_tokens < 1:
            ap.error("--real-prompts and --real-max-tokens: at least 1")
        real(args.url, sweep, args.real_prompts, args.real_max_tokens)


if __name__ == "__main__":
    main()
