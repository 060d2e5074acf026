"""A simulated GPU in simulated time, for the auto-tuner's tests and benchmark: the SGLang
simulator's own model (agents/sim/model.py), configured by the simulator's command-line flags
(`--knee`, `--best-concurrency`, `--max-running-requests`...), stepped on a fake clock by a
client that keeps `level` requests in flight. No sockets, no sleeps: an hour of a GPU's
work takes about a second."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from agents.engine.autotune import KneeFinder, reported_cap
from agents.sim import exposition
from agents.sim.cli import build, build_parser
from agents.sim.model import SimModel, SimRequest

DT = 0.05  # simulated seconds per scheduler step
MAX_TOKENS = 512
PROMPT_TOKENS = 200


@dataclass
class SimGpu:
    """One simulator with a client. `level` is how many requests the client keeps in flight
    (what the engine's per-server limit does)."""

    flags: list[str]
    seed: int = 0
    level: int = 1
    now: float = 0.0
    in_flight: dict[str, tuple[SimRequest, float]] = field(default_factory=dict)
    answers: list[tuple[float, int, float]] = field(default_factory=list)  # started, tokens, s

    def __post_init__(self) -> None:
        args = build_parser().parse_args([*self.flags, "--seed", str(self.seed),
                                          "--time-scale", "1", "--load-seconds", "0"])
        self.cfg, self.settings = build(args)
        self.model = SimModel(self.cfg, clock=lambda: self.now)
        self.model.set_ready()
        self._rids = itertools.count()

    @property
    def reported_cap(self) -> int | None:
        """max running requests as the server reports it in /server_info."""
        return reported_cap(exposition.server_info(self.model, self.settings))

    def _fill(self) -> None:
        while len(self.in_flight) < self.level:
            rid = f"r{next(self._rids)}"
            plan = self.model.plan_output(MAX_TOKENS, PROMPT_TOKENS)
            req = self.model.submit(rid, plan, PROMPT_TOKENS, 0, False)
            self.in_flight[rid] = (req, self.now)

    def step(self, dt: float = DT) -> list[tuple[float, int, float]]:
        """One scheduler step: send what the level allows, advance, collect the answers."""
        self._fill()
        self.now += dt
        self.model.tick(dt)
        done = []
        for rid, (req, started) in list(self.in_flight.items()):
            if req.finish is not None:
                del self.in_flight[rid]
                done.append((started, req.generated, self.now - started))
        self.answers += done
        return done

    def throughput(self, level: int, warmup_s: float = 20.0, measure_s: float = 90.0) -> float:
        """Output tokens/s at a fixed level, counted by the simulator itself (partial answers
        included), after a warm-up."""
        self.level = level
        t0 = self.now
        while self.now - t0 < warmup_s:
            self.step()
        self.model.take_window()
        t0 = self.now
        while self.now - t0 < measure_s:
            self.step()
        return self.model.take_window().gen_throughput


@dataclass
class TuneRun:
    levels: list[int]  # each level the finder asked for, in order
    settled: int | None
    steps_to_settle: int | None
    sim_seconds: float


def tune(gpu: SimGpu, finder: KneeFinder, max_sim_s: float = 7200.0,
         on_tick: Callable[[KneeFinder], None] | None = None,
         running: int | None = None) -> TuneRun:
    """Run the finder against the GPU until it settles (or max_sim_s): what the engine's
    AutoTuner does, with the control.json round trip taken as instant. `running`: the level
    the client runs when the finder takes over (default: the finder's)."""
    gpu.level = finder.level if running is None else running
    levels = [gpu.level]
    start = gpu.now
    while gpu.now - start < max_sim_s:
        for started, tokens, latency in gpu.step():
            finder.answer(started, tokens, latency)
        want = finder.tick(gpu.now, len(gpu.in_flight), gpu.level, True)
        if on_tick is not None:
            on_tick(finder)
        if want is not None:
            gpu.level = want
            levels.append(want)
        if finder.phase == "settled":
            return TuneRun(levels, finder.level, finder.steps, gpu.now - start)
    return TuneRun(levels, None, None, gpu.now - start)
