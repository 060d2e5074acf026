"""Scale: 10,000 requests in flight, and a resume over a 1,000,000-line prompts file.

Simulators whose modelled speed is the bottleneck (a time scale worked out from --rate, the
completions per second they serve together at their default batch cap, with max_tokens
small), so that requests really wait in them: at --in-flight 10,000 and --rate 400 a request
is held ~25 s. Three phases, each against the same simulators in the same run:

1. fresh: the engine (`fleetdeck-agent generate`: group commit, fsync, journal, progress)
   and the naive asyncio + aiohttp client of benchmarks/dispatch.py, interleaved, at the
   same in-flight count: CPU per completion (rusage of that process alone), completions/s
   while the simulators hold the full count, and the engine's event loop's worst stall
   (its own probe, agents/engine/looplag.py, read from progress.json as it runs);
2. resume: a run directory of --resume-lines prompts, all but --prompts of them done in
   closed batches (built as benchmarks/resume.py builds it): from the engine's start to
   the first request a simulator sees, and the worst loop stall until it is done;
3. router: phase 1 through SGLang's router (`sglang-router`; `[servers] router = true`),
   the one URL both clients send to, at as many in flight as the open-files limit lets the
   router hold (two sockets a request); started with ROUTER_ARGS, and a new one (after the
   simulators are idle) at half the count while a client fails.

Target: the engine's worst loop stall by the clock <= 50 ms at any time. The simulators and
the router stand for other machines' work (GPUs, a router host), so they run at the lowest
priority: nice 19 on each of their threads and, where the kernel groups each session's
processes (autogroup, on here; a nice alone is then weighed only inside its own session),
their sessions' groups too. The clients then get a CPU when they ask, as on a real node with
its hundred cores, and the clock measures the engine, not the 2-core box. --servers-share-cpu
leaves them at the clients' priority (the box's shape before): a long stall is then mostly
the loop thread waiting for a CPU, and the target is held to the engine's own share (the
clock's less that wait, read from /proc/thread-self/schedstat). Printed beside it: the loop's
CPU and its wait in that tick, and an idle process beside the engine running the same probe
(the stalls the box alone causes; its own share, ~0, checks the method). The soft open-files
limit is raised to the hard one at start, and the hard one, where we may (root), to what the
router needs at the full count (a socket per request, at both ends, and the router's two).
--trace-stalls runs the engine with benchmarks/stalls.py's sampler: where its stalls come from.

    .venv/bin/python benchmarks/scale.py [--in-flight 10000] [--servers 4] [--rate 400]
        [--prompts 30000] [--resume-lines 1000000] [--rounds 1] [--phases fresh,resume,router]
        [--servers-share-cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.engine.looplag import TICK_S  # noqa: E402
from agents.sim.config import SimConfig  # noqa: E402
from benchmarks.dispatch import AIOHTTP, completed, timed  # noqa: E402
from benchmarks.resume import BATCH, build  # noqa: E402
from benchmarks.stalls import read_stalls, summary, traced_cmd  # noqa: E402
from tests.engine.runs import write_prompts, write_spec  # noqa: E402
from tests.servers.ports import kill_pid, wait_until  # noqa: E402
from tests.servers.router import point_at_router, start_router  # noqa: E402
from tests.simserver import SimHandle, start_sim  # noqa: E402

TARGET_STALL_MS = 50.0
# The same probe as the engine's (agents/engine/looplag.py) in a process with nothing else to
# do: what the box's scheduler alone costs a loop (on a loaded box, a stall an engine run
# sees may be no work of its own). Prints its worst and its stalls over the target at SIGTERM.
IDLE_PROBE = f"""
import asyncio, signal, time
from agents.engine.looplag import LoopLag
class Probe(LoopLag):
    over = []
    def observe(self, lag_s, now=None, cpu_s=None, wait_s=None):
        super().observe(lag_s, now, cpu_s, wait_s)
        if lag_s * 1000 > {TARGET_STALL_MS!r}:
            self.over.append(round(lag_s * 1000))
async def main():
    probe, stop = Probe(), asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(probe.run())
    await stop.wait()
    print(probe.worst_ms, len(probe.over), probe.worst_own_ms, flush=True)
asyncio.run(main())
"""
ENGINE_ONLY = False  # --engine-only: no naive client (its ratios are then not printed)
TRACE = False  # --trace-stalls: the engine with benchmarks/stalls.py's sampler
ENGINE_SET: dict[str, Any] = {}  # --set KEY=VALUE: [generate] settings of every engine run
SHARED = False  # --servers-share-cpu: the simulators and the router at the clients' priority
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
ROUTER_SPARE_FILES = 500
# The router as a benchmark of known-good workers needs it. With its defaults, at ~10,000 in
# flight on a loaded 2-core box, /health (a decode step, SGLang's and the simulator's) took
# over its 5 s timeout, and a few hundred upstream sends failed while thousands of
# connections opened at once (it retries them: all got through); 10 failures open a
# worker's circuit for 60 s, all four opened, and it answered 503 "no_available_workers",
# which the naive client (no retry) exits on.
ROUTER_ARGS = ("--health-check-timeout-secs", "60", "--disable-circuit-breaker")
HELD = 0.95  # "the full count": the simulators hold at least this share of --in-flight
LOWEST = 19


def background(pid: int) -> None:
    """The process group led by `pid` (a simulator or the router, each started in a session
    of its own) at the lowest priority: every thread of it, and its session's group where the
    kernel has autogroup (a nice is then weighed only against the session's own threads)."""
    if SHARED:
        return
    os.setpriority(os.PRIO_PGRP, pid, LOWEST)
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(LOWEST))
    except FileNotFoundError:  # no autogroup: the threads' nice is weighed box-wide
        pass


def time_scale(rate: float, servers: int, max_tokens: int) -> float:
    """Wall s per simulated s so that `servers` simulators at their default batch cap finish
    `rate` answers of `max_tokens` tokens per wall second together."""
    cfg = SimConfig()
    cap = cfg.max_running_requests
    sim_rate = cap * cfg.per_request_rate(cap) / max_tokens  # answers per simulated s
    return sim_rate * servers / rate


@dataclass
class Watch:
    """What a poller saw while one client ran: the simulators' /sim/state (requests held,
    answered, received) and, for the engine, its progress.json."""

    sims: list[SimHandle]
    progress: Path | None = None
    fast_until_first: bool = False  # poll every 10 ms until a simulator sees a request
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))
    # (t, held, answered: finished less aborted, the client's CPU s)
    samples: list[tuple[float, int, int, float]] = field(default_factory=list)
    requests0: int = -1
    first_request_s: float | None = None
    lag_ms: float = 0.0  # the worst loop_lag_ms seen in progress.json
    lag_at: tuple[float, int] | None = None  # (t, completed) where it was first seen
    in_flight: int = 0  # the engine's own count, its largest
    rss_mib: float = 0.0  # the client's largest resident set seen

    def states(self) -> list[dict[str, Any]]:
        return [self.client.get(f"{s.url}/sim/state").json() for s in self.sims]

    def __call__(self, t: float, pid: int) -> float:
        try:
            states = self.states()
            with open(f"/proc/{pid}/stat") as f:  # utime and stime, after the (comm)
                ticks = f.read().rsplit(")", 1)[1].split()[11:13]
            with open(f"/proc/{pid}/statm") as f:
                self.rss_mib = max(self.rss_mib, int(f.read().split()[1]) * PAGE / 2**20)
        except (httpx.HTTPError, OSError):  # a simulator busy past 10 s, or the client gone
            return 0.25
        cpu = (int(ticks[0]) + int(ticks[1])) / CLOCK_TICKS
        received = sum(s["requests_total"] for s in states)
        if self.requests0 < 0:
            self.requests0 = received
        if self.first_request_s is None and received > self.requests0:
            self.first_request_s = t
        self.samples.append((t, sum(s["in_flight"] for s in states),
                             sum(s["finished_total"] - s["aborted_total"] for s in states), cpu))
        if self.progress is not None:
            try:
                snap = json.loads(self.progress.read_text())
            except (OSError, ValueError):
                snap = None
            if snap is not None:
                self.in_flight = max(self.in_flight, snap.get("in_flight") or 0)
                lag = snap.get("loop_lag_ms") or 0.0
                if lag > self.lag_ms:
                    self.lag_ms, self.lag_at = lag, (t, snap.get("completed") or 0)
        return 0.01 if self.fast_until_first and self.first_request_s is None else 0.25

    def held(self) -> int:
        return max((h for _, h, _, _ in self.samples), default=0)

    def while_held(self, count: int) -> tuple[float, float] | None:
        """(answers per second, client CPU s per answer) from the first to the last poll
        that saw the simulators hold >= HELD x count (the ramp and the tail left out)."""
        full = [(t, a, c) for t, h, a, c in self.samples if h >= HELD * count]
        if len(full) < 2 or full[-1][1] <= full[0][1]:
            return None
        (t0, a0, c0), (t1, a1, c1) = full[0], full[-1]
        return (a1 - a0) / (t1 - t0), (c1 - c0) / (a1 - a0)


@dataclass
class Figures:
    cpu: list[float] = field(default_factory=list)  # CPU s per completion, each round
    rate: list[float] = field(default_factory=list)  # completions/s over the whole run
    rate_held: list[float] = field(default_factory=list)  # ... while the full count was held
    cpu_held: list[float] = field(default_factory=list)  # CPU s per answer, the same span
    held: int = 0
    stall_ms: float = 0.0
    stall_at: tuple[float, int] | None = None
    # The worst stall's tick: the loop thread's CPU and its wait for a CPU; the worst stall
    # less that wait (the engine's own: what the target is held to).
    stall_cpu_ms: float = 0.0
    stall_wait_ms: float = 0.0
    own_ms: float = 0.0
    idle_stall_ms: float = 0.0  # the idle probe's worst beside the engine
    idle_over: int = 0  # ... and its stalls over the target
    idle_own_ms: float = 0.0  # ... and its worst less its wait for a CPU (~0: the method)
    in_flight: int = 0
    rss_mib: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def add(self, cpu_s: float, wall: float, n: int, watch: Watch, count: int) -> None:
        self.cpu.append(cpu_s / n)
        self.rate.append(n / wall)
        held = watch.while_held(count)
        if held is not None:
            self.rate_held.append(held[0])
            self.cpu_held.append(held[1])
        self.held = max(self.held, watch.held())
        self.in_flight = max(self.in_flight, watch.in_flight)
        self.rss_mib = max(self.rss_mib, watch.rss_mib)
        if watch.lag_ms > self.stall_ms:
            self.stall_ms, self.stall_at = watch.lag_ms, watch.lag_at

    def idle_line(self) -> str:
        return (f"idle probe beside the engine: worst stall {self.idle_stall_ms:.1f} ms by the "
                f"clock, {self.idle_over} over {TARGET_STALL_MS:.0f} ms (the box, not the "
                f"engine); less its wait for a CPU {self.idle_own_ms:.1f} ms")

    def stall_line(self, label: str) -> str:
        """The verdict: the engine's own share of its worst stall against the target, beside
        the clock's figure (on a shared box mostly a wait for a CPU)."""
        held_to = self.own_ms if SHARED else self.stall_ms
        verdict = (f"target <= {TARGET_STALL_MS:.0f} ms "
                   f"{'(own share, the servers sharing the CPU)' if SHARED else 'by the clock'}"
                   f": {'met' if held_to <= TARGET_STALL_MS else 'MISSED'}")
        return (f"worst loop stall{label}: {self.stall_ms:.1f} ms by the clock "
                f"({self.stall_cpu_ms:.0f} ms of the loop's CPU and {self.stall_wait_ms:.0f} ms "
                f"waiting for a CPU in its "
                f"{TICK_S * 1000:.0f} ms tick); the engine's own (the clock's less the wait): "
                f"{self.own_ms:.1f} ms ({verdict})")

    def line(self, name: str) -> str:
        held = (f"; while >= {HELD:.0%} held {statistics.median(self.cpu_held) * 1000:.3f} "
                f"and {statistics.median(self.rate_held):,.0f}/s" if self.rate_held else
                "; never held the full count")
        return (f"{name + ':':9} {statistics.median(self.cpu) * 1000:.3f} CPU s per 1,000, "
                f"{statistics.median(self.rate):,.0f} completions/s over the run{held}; at "
                f"most {self.held:,} held at the simulators; {self.rss_mib:,.0f} MiB resident")


def final_progress(run_dir: Path) -> dict[str, Any]:
    snap: dict[str, Any] = json.loads((run_dir / "progress.json").read_text())
    return snap


def engine_run(run_dir: Path, spec: Path, n: int, watch: Watch, figures: Figures,
               count: int) -> dict[str, Any]:
    probe = subprocess.Popen([sys.executable, "-c", IDLE_PROBE], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE)
    trace = run_dir.parent / "stalls.jsonl"
    cmd = ([sys.executable, "-m", "agents.cli", "generate", str(spec)] if not TRACE else
           traced_cmd(["generate", str(spec)], trace))
    try:
        cpu, wall = timed(cmd, dict(os.environ), watch)
    finally:
        probe.terminate()
        worst, over, own = probe.communicate(timeout=30)[0].split()
    figures.idle_stall_ms = max(figures.idle_stall_ms, float(worst))
    figures.idle_over += int(over)
    figures.idle_own_ms = max(figures.idle_own_ms, float(own))
    snap = final_progress(run_dir)
    if snap["completed"] < n:
        raise SystemExit(f"engine: {snap['completed']:,} of {n:,} completed, "
                         f"{snap['failed']:,} failed")
    figures.add(cpu, wall, n, watch, count)
    # The figure at the end is the worst since start, whatever the polls caught.
    if snap["loop_lag_max_ms"] >= figures.stall_ms:
        if snap["loop_lag_max_ms"] > figures.stall_ms:
            figures.stall_at = None
        figures.stall_ms = snap["loop_lag_max_ms"]
        figures.stall_cpu_ms = snap["loop_lag_max_cpu_ms"]
        figures.stall_wait_ms = snap["loop_lag_max_wait_ms"]
    figures.own_ms = max(figures.own_ms, snap["loop_lag_own_max_ms"])
    if TRACE:
        stalls, collections = read_stalls(trace, TARGET_STALL_MS)
        print(f"{run_dir.parent.name}: {len(stalls)} stalls over {TARGET_STALL_MS:.0f} ms "
              f"(sampled, {trace}):\n{summary(stalls, collections)}")
    for key in ("retried", "hedges", "deadline_misses", "busy_answers"):
        figures.notes[key] = figures.notes.get(key, 0) + (snap.get(key) or 0)
    log = (run_dir / "logs" / "generate.log").read_text(errors="replace")
    figures.notes["servers set aside"] = (figures.notes.get("servers set aside", 0)
                                          + log.count(") set aside: "))
    return snap


def fresh(root: Path, label: str, urls: list[str], sims: list[SimHandle], per_url: int,
          prompts: Path, n: int, rounds: int, max_tokens: int, router: bool) -> dict[str, Figures]:
    """Phase 1 (or 3, `router`): the naive client and the engine, interleaved, `rounds`."""
    count = per_url * len(urls)
    figures = {"aiohttp": Figures(), "engine": Figures()}
    for r in range(rounds):
        out = root / f"{label}-aiohttp-{r}.jsonl"
        watch = Watch(sims)
        if ENGINE_ONLY:
            out.touch()
        else:
            try:
                cpu, wall = timed([sys.executable, "-c", AIOHTTP.replace(
                    '"max_tokens": 256', f'"max_tokens": {max_tokens}'), json.dumps(
                    [urls, str(prompts), str(out), per_url])], poll=watch)
                if completed(out) != n:
                    raise SystemExit(f"aiohttp: {completed(out):,} of {n:,} lines")
            except SystemExit as exc:
                if not router:
                    raise
                # SGLang's router failed a burst of upstream sends past its retries and the
                # naive client's (it exits on an HTTP error): the engine, which retries,
                # still runs at this count; no ratio from this level.
                lines = str(exc).splitlines()
                said = [x for x in lines if "SystemExit" in x or "Error" in x] or lines
                figures["aiohttp"].notes["failed"] = said[-1].strip(" |")[:300]
                wait_until(lambda w=watch: sum(s["in_flight"] for s in w.states()) == 0,
                           600, "the simulators finishing what the naive client left them",
                           interval=0.5)
            else:
                figures["aiohttp"].add(cpu, wall, n, watch, count)
        out.unlink()
        (root / f"{label}-{r}").mkdir()
        spec = engine_spec(root / f"{label}-{r}" / "run.toml", prompts, urls, per_url,
                           max_tokens)
        if router:
            point_at_router(spec)
        watch = Watch(sims, spec.parent / "run" / "progress.json")
        engine_run(spec.parent / "run", spec, n, watch, figures["engine"], count)
    return figures


def engine_spec(path: Path, prompts: Path, urls: list[str], per_url: int, max_tokens: int,
                **generate: Any) -> Path:
    return write_spec(path, prompts, urls, **{
        "batch_size": BATCH, "max_tokens": max_tokens, "concurrency_per_server": per_url,
        "max_concurrency": per_url, "request_timeout_s": 600.0, "connect_timeout_s": 30.0,
        **generate, **ENGINE_SET})


def via_router(root: Path, urls: list[str], sims: list[SimHandle], through: int,
               prompts: Path, n: int, rounds: int, max_tokens: int
               ) -> tuple[int, dict[str, Figures]]:
    """Phase 3 at `through` in flight, and at half that while the engine fails there (where
    only the naive client fails, which retries an answer twice at most, the engine's figures
    stand alone): each level on a router of its own, once the simulators have finished what
    the failed level left them (a router's open circuits and a simulator's backlog must not
    fail the next level too, as they once failed every level)."""
    idle = Watch(sims)
    while True:
        router = start_router(root, urls, *ROUTER_ARGS, health_interval_s=5)
        try:
            background(router.proc.pid)
            return through, fresh(root, f"router{through}", [router.url], sims, through,
                                  prompts, n, rounds, max_tokens, router=True)
        except SystemExit as exc:
            if through // 2 < len(urls):
                raise
            print(f"through the router at {through:,} in flight: {exc}\ntrying "
                  f"{through // 2:,} on a new router")
            through //= 2
        finally:
            router.kill()
        wait_until(lambda: sum(s["in_flight"] for s in idle.states()) == 0, 600,
                   "the simulators finishing what the failed level left them", interval=0.5)


def report(label: str, count: int, figures: dict[str, Figures]) -> None:
    base, eng = figures["aiohttp"], figures["engine"]
    if base.cpu:
        print(base.line("aiohttp"))
    print(eng.line("engine"))
    notes = ", ".join(f"{k} {v:,}" for k, v in eng.notes.items())
    print(f"engine: at most {eng.in_flight:,} in flight by its own count; {notes}")
    if "failed" in base.notes:
        print(f"aiohttp at {count:,} in flight{label}: failed, no ratio: "
              f"{base.notes['failed']}")
    if not base.cpu:  # --engine-only, or the naive client failed
        print(eng.stall_line(label))
        print(eng.idle_line())
        return
    whole = statistics.median(eng.cpu) / statistics.median(base.cpu)
    if eng.cpu_held and base.cpu_held:
        ratio = statistics.median(eng.cpu_held) / statistics.median(base.cpu_held)
        print(f"ratio engine/aiohttp CPU per completion at {count:,} in flight{label}: "
              f"{ratio:.2f}x (over the whole runs, ramp and tail in: {whole:.2f}x)")
        rate = statistics.median(eng.rate_held) / statistics.median(base.rate_held)
        print(f"ratio engine/aiohttp completions/s at {count:,} in flight{label}: {rate:.2f}x")
    else:  # one of them never held the count: the whole runs
        print(f"ratio engine/aiohttp CPU per completion at {count:,} in flight{label}: "
              f"{whole:.2f}x (whole runs: {count:,} were never held by both)")
    where = ("" if eng.stall_at is None else
             f"; a stall over the last minute's first seen {eng.stall_at[0]:.1f} s in, at "
             f"{eng.stall_at[1]:,} completed")
    print(eng.stall_line(label) + where)
    print(eng.idle_line())


def resume(root: Path, sims: list[SimHandle], per_url: int, lines: int, rest: int,
           max_tokens: int) -> None:
    """Phase 2: `lines` prompts, all but the last `rest` done; the engine resumed."""
    d = root / "resume"
    d.mkdir()
    t = time.perf_counter()
    build(d, lines - rest, lines)
    print(f"built a run of {lines:,} prompts, {lines - rest:,} done in "
          f"{(lines - rest) // BATCH:,} batches, in {time.perf_counter() - t:.1f} s")
    # build()'s first prepare wrote control.json from its own spec (max_tokens 4096,
    # concurrency 40), which a resume follows: gone, the spec below sets them again.
    (d / "run" / "control.json").unlink()
    # The spec build() wrote, now pointed at the simulators (its sampling, none, as pinned).
    spec = engine_spec(d / "run.toml", d / "prompts.jsonl", [s.url for s in sims], per_url,
                       max_tokens, sampling={})
    watch = Watch(sims, d / "run" / "progress.json", fast_until_first=True)
    figures = Figures()
    snap = engine_run(d / "run", spec, rest, watch, figures, per_url * len(sims))
    assert snap["completed"] == lines, f"resume: {snap['completed']} of {lines} done"
    first = watch.first_request_s
    print(f"resume: {rest:,} to do at {per_url * len(sims):,} in flight, "
          f"{statistics.median(figures.rate):,.0f} completions/s, at most {figures.held:,} "
          f"held at the simulators")
    print(f"resume over {lines:,} lines: first request after "
          f"{'n/a' if first is None else f'{first:.2f}'} s")
    print(figures.stall_line(f" on the resume over {lines:,} lines"))
    print(figures.idle_line())


def load_average(when: str) -> str:
    load = os.getloadavg()
    return (f"load average {when} {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
            f"{os.cpu_count()} CPUs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in-flight", type=int, default=10_000, help="requests in flight in all")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=400.0,
                    help="completions/s the simulators serve together (their time scale)")
    ap.add_argument("--prompts", type=int, default=None,
                    help="prompts per fresh run and left to do on resume (3 x --in-flight)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--resume-lines", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--phases", default="fresh,resume,router",
                    help="which of fresh, resume, router to run (comma-separated)")
    ap.add_argument("--router-in-flight", type=int, default=None,
                    help="in flight through the router (--in-flight, as far as the open-files "
                    "limit allows)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    ap.add_argument("--trace-stalls", action="store_true",
                    help="sample the engine's stack in its stalls (benchmarks/stalls.py; "
                    "costs it CPU: its figures are then not the engine's)")
    ap.add_argument("--engine-only", action="store_true",
                    help="leave out the naive client: the engine's figures and stalls alone")
    ap.add_argument("--servers-share-cpu", action="store_true",
                    help="leave the simulators and the router at the clients' priority: the "
                    "target is then held to the engine's own share of a stall")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="a [generate] setting for every engine run (e.g. hedge=false)")
    args = ap.parse_args()
    global TRACE, ENGINE_ONLY, SHARED
    TRACE, ENGINE_ONLY, SHARED = args.trace_stalls, args.engine_only, args.servers_share_cpu
    for item in args.set:
        key, _, value = item.partition("=")
        ENGINE_SET[key] = json.loads(value)
    phases = set(args.phases.split(","))
    if phases - {"fresh", "resume", "router"}:
        ap.error(f"--phases: fresh, resume or router, not {args.phases}")
    n = args.prompts or 3 * args.in_flight
    per_url = args.in_flight // args.servers
    count = per_url * args.servers
    if (args.resume_lines - n) % BATCH or args.resume_lines <= n:
        ap.error(f"--resume-lines minus --prompts: a positive multiple of {BATCH}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The router holds two sockets a request (the client's and the worker's): past the
    # limit it cannot accept, so it gets what the limit allows; root may raise the limit.
    want = 2 * (args.router_in_flight or count) + ROUTER_SPARE_FILES
    if want > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            hard = want
        except (ValueError, OSError):  # not root, or past fs.nr_open
            pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the children inherit it
    router_cap = (hard - ROUTER_SPARE_FILES) // 2 // 250 * 250
    through = args.router_in_flight or min(count, router_cap)
    scale = time_scale(args.rate, args.servers, args.max_tokens)
    root = args.keep or Path(tempfile.mkdtemp(prefix="fd-bench-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    sims = [start_sim(root, "--time-scale", f"{scale:.6g}", "--load-seconds", "0",
                      "--decode-log-interval-s", "60", "--seed", str(i), name=f"sim{i}")
            for i in range(args.servers)]
    try:
        for sim in sims:
            background(sim.proc.pid)
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, n)
        urls = [s.url for s in sims]
        priority = "at the clients' priority" if SHARED else f"at nice {LOWEST}"
        print(f"{n:,} prompts a run, {args.servers} simulators at time scale {scale:.3g} "
              f"(together {args.rate:,.0f} answers/s of {args.max_tokens} tokens), "
              f"{per_url:,} in flight per server; open files {soft:,} -> {hard:,}; "
              f"{args.rounds} round(s); simulators and router {priority}; "
              f"{load_average('at the start')}")
        if "fresh" in phases:
            figures = fresh(root, "fresh", urls, sims, per_url, prompts, n, args.rounds,
                            args.max_tokens, router=False)
            report("", count, figures)
        if "resume" in phases:
            resume(root, sims, per_url, args.resume_lines, n, args.max_tokens)
        if "router" in phases:
            if through < count:
                print(f"through the router at {through:,} in flight, not {count:,}: it holds "
                      f"two sockets a request, and the open-files limit is {hard:,}")
            through, figures = via_router(root, urls, sims, through, prompts, n, args.rounds,
                                          args.max_tokens)
            print(f"through SGLang's router ({len(urls)} workers):")
            report(" through the router", through, figures)
        print(load_average("at the end"))
    finally:
        for s in sims:
            kill_pid(s.proc)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
