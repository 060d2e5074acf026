"""TUI cost: a simulated fleet of 128 nodes x 8 GPUs (1,024 GPUs), each node pushing a status
snapshot once a second, fed to the fleetdeck TUI as in real use (the JSON-RPC line decoded as
AgentLink does, then FleetState.apply, the history, and the coalesced redraw), headless.

Measured, per phase: the CPU share of one core (process_time / wall) and the 95th percentile
of the CPU one redraw tick costs: the view's show() plus everything it sets off before the next
tick (the screen's layout and compositing, the tables' rendering and idle work). Also the p95
of one update's decode + apply, and of its cost to the screen (its apply plus its share of the
tick that drew it). Times are CPU (process_time), not wall: the machine is shared, and a
preempted tick would otherwise count another process's work. Phases: the fleet view (a row per
node), then one generation node's view (8 GPU rows, run panel, sparklines); then the baseline,
a bare Textual DataTable with the same 10 columns fed the same lines in the same run, decoding
each line and updating its row's cells at once.

Headless Textual composes every frame but writes no terminal output; both apps here also
encode each frame to terminal escape sequences (thrown away), so that cost is counted too.

    .venv/bin/python benchmarks/tui.py [--seconds 20] [--nodes 128] [--gpus 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from textual.app import App, ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.fleet import ConsoleSettings, Fleet, Node  # noqa: E402
from console.transport import status_snapshot  # noqa: E402
from console.tui import app as app_module  # noqa: E402
from console.tui.app import FleetdeckApp  # noqa: E402
from console.tui.widgets.fleet_order import SORTABLE  # noqa: E402
from console.tui.widgets.fleet_table import FLEET_COLUMNS  # noqa: E402

SIZE = (160, 48)
WARM_S = 2  # seconds fed before each view is measured
T0 = time.time()


# -- the simulated fleet ---------------------------------------------------------------------


def make_fleet(n: int) -> Fleet:
    return Fleet(nodes=[Node(name=f"gen-{i:02d}", run_dir=f"/data/runs/r{i}", host=f"gpu-{i}")
                        for i in range(n)],
                 console=ConsoleSettings(bell=False), source="benchmark")


def make_lines(nodes: int, gpus: int, seconds: int, seed: int = 7) -> list[list[bytes]]:
    """lines[s][i]: node i's status notification at second s, as the agent sends it."""
    rng = random.Random(seed)
    enc = msgspec.json.Encoder()
    out: list[list[bytes]] = []
    completed = [rng.randint(10_000, 400_000) for _ in range(nodes)]
    failed = [rng.randint(0, 900) for _ in range(nodes)]
    for s in range(seconds):
        row = []
        for i in range(nodes):
            now = T0 + s
            done = rng.randint(8, 20)
            completed[i] += done
            failed[i] += 1 if rng.random() < 0.05 else 0
            servers = []
            sp = {}
            for g in range(gpus):
                tok = 2200 + rng.uniform(-150, 150)
                acc = 3.0 + rng.uniform(-0.1, 0.1)
                servers.append({
                    "number": g, "url": f"http://127.0.0.1:{30000 + g}", "state": "healthy",
                    "gpu": g, "port": 30000 + g, "pid": 1000 + g, "restarts": 0,
                    "in_flight": rng.randint(36, 40), "limit": 40, "completed": completed[i] // 8,
                    "failed": failed[i] // 8, "req_per_s": done / gpus, "tok_per_s": tok,
                    "queued_reqs": rng.randint(0, 6), "accept_length": acc,
                    "accept_length_window": acc, "metrics_at": now, "health_checked_at": now,
                    "gpu_stats": {"util_pct": rng.uniform(90, 100), "mem_used_mib": 170_000.0,
                                  "mem_total_mib": 183_359.0, "temp_c": rng.uniform(58, 70),
                                  "power_w": rng.uniform(850, 950)}})
                sp[str(g)] = {"url": "", "state": "healthy", "in_flight": 40, "limit": 40,
                              "completed": completed[i] // 8, "failed": failed[i] // 8,
                              "req_per_s": done / gpus, "tok_per_s": tok, "accept_length": acc}
            c = completed[i]
            progress = {
                "total": 913_786, "completed": c, "failed": failed[i],
                "rate_per_sec": float(done), "eta_hours": (913_786 - c) / done / 3600,
                "total_input_tokens": c * 255, "total_output_tokens": c * 1800,
                "avg_output_tokens": 1800.0, "elapsed_hours": 3.0, "s3_uploaded": c // 500,
                "s3_bytes": c * 8000, "status": "running", "truncated": c // 6,
                "empty": c // 300, "max_tokens": 8192, "concurrency": 40,
                "in_flight": 40 * gpus, "retried": 0, "s3_pending": 1, "control_rev": 3,
                "updated_at": now, "servers": sp, "run": f"run-{i}"}
            alerts = ([{"code": "failure_rate", "severity": "warning", "message": "failures up",
                        "since": T0}] if i % 11 == 3 else [])
            snap = {"kind": "generate", "run": f"run-{i}", "run_dir": f"/data/runs/r{i}",
                    "host": f"gpu-{i}", "status": "running", "updated_at": now,
                    "source": "supervisor", "agent_version": "0.1.0", "progress": progress,
                    "progress_age_s": 0.3, "servers": servers, "alerts": alerts,
                    "disk": {"path": "/data", "free_bytes": 10**12, "total_bytes": 4 * 10**12}}
            row.append(b'{"jsonrpc":"2.0","method":"status","params":' + enc.encode(snap)
                       + b"}\n")
        out.append(row)
    return out


# -- counting the terminal output headless mode skips ----------------------------------------


def encode_frames(app: App[Any]) -> None:
    """Encode each composed frame to escape sequences as a terminal app would (dropped)."""
    from textual._compositor import CompositorUpdate

    display = app._display
    sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the app

    def encoded(screen: Any, renderable: Any) -> None:
        display(screen, renderable)
        if isinstance(renderable, CompositorUpdate):
            sink.write(renderable.render_segments(app.console))

    app._display = encoded  # type: ignore[method-assign]


# -- feeding ---------------------------------------------------------------------------------


async def feed(lines: list[list[bytes]], names: list[str], seconds: float,
               apply: Callable[[str, bytes], None]) -> tuple[float, float, int]:
    """Each node's update at its own offset within each second. Returns (wall, cpu, count)."""
    n = len(names)
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    count = 0
    for s in range(int(seconds)):
        for i, name in enumerate(names):
            due = start_wall + s + i / n
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            apply(name, lines[s % len(lines)][i])
            count += 1
    await asyncio.sleep(max(0.0, start_wall + int(seconds) - time.perf_counter()))
    return time.perf_counter() - start_wall, time.process_time() - start_cpu, count


class Timed:
    """FleetdeckApp's costs, per update and per redraw tick, on the real code paths, in CPU
    seconds. A tick: the view's show() plus the screen updates (layout, compositing, drawing)
    and the DataTables' idle work (column widths) that run before the next tick."""

    def __init__(self, app: FleetdeckApp) -> None:
        self.app = app
        self.applies: list[float] = []  # decode + FleetState.apply + history, per update
        self.pending: list[float] = []  # applies since the last redraw
        self.shows: list[float] = []  # the view's show() alone, per tick
        self.ticks: list[float] = []  # show() + what it set off, per tick
        self.composite: list[float] = []  # an update's apply + the whole tick that drew it
        self.shared: list[float] = []  # an update's apply + its share of that tick
        self.recording = False
        self._tick: float | None = None  # the open tick's CPU so far
        self._tick_applies: list[float] = []
        redraw = app.redraw

        def timed_redraw() -> None:
            self.close_tick()
            t = time.process_time()
            redraw()
            dt = time.process_time() - t
            if self.recording:
                self.shows.append(dt)
                self._tick = dt
                self._tick_applies = self.pending[:]
            self.pending.clear()

        app.redraw = timed_redraw  # type: ignore[method-assign]
        self._patch(Screen, "_on_timer_update")
        self._patch(DataTable, "_on_idle")

    def _patch(self, cls: type, name: str) -> None:
        """Count `cls.name`'s CPU in the open tick (the class is patched for this process: the
        benchmark's apps are the only ones in it)."""
        original = getattr(cls, name)
        timed = self

        if asyncio.iscoroutinefunction(original):
            async def counted_async(obj: Any, *args: Any) -> Any:
                t = time.process_time()
                try:
                    return await original(obj, *args)
                finally:
                    timed.count(time.process_time() - t)
            setattr(cls, name, counted_async)
        else:
            def counted(obj: Any, *args: Any) -> Any:
                t = time.process_time()
                try:
                    return original(obj, *args)
                finally:
                    timed.count(time.process_time() - t)
            setattr(cls, name, counted)

    def count(self, dt: float) -> None:
        if self._tick is not None:
            self._tick += dt

    def close_tick(self) -> None:
        if self._tick is not None and self.recording:
            tick = self._tick
            self.ticks.append(tick)
            self.composite += [a + tick for a in self._tick_applies]
            self.shared += [a + tick / len(self._tick_applies) for a in self._tick_applies]
        self._tick = None

    def apply(self, name: str, line: bytes) -> None:
        t = time.process_time()
        snap = status_snapshot(line)  # what AgentLink._read_loop does with each line
        assert snap is not None
        self.app.ingest(name, snap)
        dt = time.process_time() - t
        if self.recording:
            self.applies.append(dt)
            self.pending.append(dt)

    def reset(self) -> None:
        self.applies, self.pending, self.composite, self.shared = [], [], [], []
        self.shows, self.ticks, self._tick = [], [], None


async def run_fleetdeck(lines: list[list[bytes]], names: list[str], gpus: int, seconds: float,
                        node_seconds: float) -> list[dict[str, Any]]:
    fleet = make_fleet(len(names))
    app = FleetdeckApp(fleet, connect=False, quiet_gc=True)  # as fleetdeck runs it
    encode_frames(app)
    timed = Timed(app)
    results = []
    async def measure(label: str, duration: float) -> None:
        """Warm up (not counted: rows made, columns sized, the layouts that follow land in
        the next second's first tick), then feed for `duration` with every tick timed."""
        timed.recording = False
        await feed(lines, names, WARM_S, timed.apply)
        await asyncio.sleep(0)
        timed.reset()
        timed.recording = True
        wall, cpu, count = await feed(lines, names, duration, timed.apply)
        timed.close_tick()
        timed.recording = False
        results.append(summary(label, wall, cpu, count, timed))

    async with app.run_test(size=SIZE) as pilot:
        for name in names:
            app.state.set_link(name, "connected", None)
        await measure(f"fleetdeck: fleet view ({len(names)} rows)", seconds)
        # Sorted by rate, which every node's snapshot changes: rows move on most ticks.
        await pilot.press(*"o" * (SORTABLE.index("rate") + 1))
        await pilot.pause()
        await measure("fleetdeck: fleet sorted by rate", seconds)
        await pilot.press("enter")  # the first node's screen
        await pilot.pause()
        await measure(f"fleetdeck: node view ({gpus} GPUs)", node_seconds)
        assert not app.render_errors, app.render_errors
    return results


def p95(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    return statistics.quantiles(xs, n=20, method="inclusive")[18] if len(xs) > 1 else xs[0]


def summary(label: str, wall: float, cpu: float, count: int, timed: Timed) -> dict[str, Any]:
    return {"label": label, "cpu": cpu / wall, "count": count, "wall": wall,
            "p95_apply": p95(timed.applies), "p95_show": p95(timed.shows),
            "p95_tick": p95(timed.ticks), "p95_share": p95(timed.shared),
            "p95_update": p95(timed.composite), "redraws": len(timed.ticks)}


# -- the baseline: a bare DataTable ----------------------------------------------------------


class BareTable(App[None]):
    def compose(self) -> ComposeResult:
        yield DataTable(cursor_type="row")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label, _width in FLEET_COLUMNS:
            table.add_column(label, key=key)


def bare_row(name: str, snap: dict[str, Any]) -> tuple[str, ...]:
    p = snap["progress"]
    return (name, "generate", snap["run"], snap["status"],
            f"{100 * p['completed'] / p['total']:.1f}% {p['completed']}/{p['total']}",
            f"{p['rate_per_sec']:.1f}/s", f"{p['eta_hours']:.1f} h",
            f"{p['failed']} ({100 * p['failed'] / max(1, p['completed']):.2f}%)",
            str(len(snap["alerts"])), "0 s")


async def run_bare(lines: list[list[bytes]], names: list[str], seconds: float
                   ) -> dict[str, Any]:
    app = BareTable()
    encode_frames(app)
    times: list[float] = []
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(DataTable)
        for name in names:
            table.add_row(*([""] * len(FLEET_COLUMNS)), key=name)
        await pilot.pause()

        def apply(name: str, line: bytes) -> None:
            t = time.process_time()
            snap = msgspec.json.decode(line)["params"]
            for (key, _l, _w), cell in zip(FLEET_COLUMNS, bare_row(name, snap), strict=True):
                table.update_cell(name, key, cell, update_width=True)
            times.append(time.process_time() - t)

        await feed(lines, names, 1, apply)
        times.clear()
        wall, cpu, count = await feed(lines, names, seconds, apply)
    return {"label": "baseline: bare DataTable", "cpu": cpu / wall, "count": count,
            "wall": wall, "p95_apply": p95(times), "p95_show": float("nan"),
            "p95_tick": float("nan"), "p95_share": p95(times), "p95_update": p95(times),
            "redraws": 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="per app; the fleetdeck run splits it 60/40 between the views")
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    fleet_s = max(2, round(args.seconds * 0.6))
    node_s = max(2, round(args.seconds) - fleet_s)
    names = [f"gen-{i:02d}" for i in range(args.nodes)]
    lines = make_lines(args.nodes, args.gpus, int(args.seconds) + 2)
    size_kb = sum(len(x) for x in lines[0]) / len(lines[0]) / 1024
    print(f"TUI benchmark: {args.nodes} nodes x {args.gpus} GPUs, one status line per node "
          f"per second ({size_kb:.1f} KiB each), {SIZE[0]}x{SIZE[1]} headless, frames "
          f"encoded to escape sequences; redraw every {app_module.REDRAW_S} s; "
          f"{fleet_s} s fleet view, {fleet_s} s sorted by rate, {node_s} s node view, then "
          f"{int(args.seconds)} s bare DataTable", flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)", flush=True)
    defaults = gc.get_threshold()
    ours = asyncio.run(run_fleetdeck(lines, names, args.gpus, fleet_s, node_s))
    gc.unfreeze()  # the baseline with Python's collector as it comes
    gc.set_threshold(*defaults)
    bare = asyncio.run(run_bare(lines, names, int(args.seconds)))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    print("\ncolumns (CPU time): CPU share of one core; p95 of an update's decode + state; of "
          "the view's show() per tick; of a whole tick (show() + the layout, compositing and "
          "drawing it sets off); of one update's cost to the screen (decode + state + its "
          "share of the tick that drew it; the bare table: decode + its row's update_cell "
          "calls); of the worst bound (decode + state + the whole tick)")
    print(f"{'':32} {'CPU':>6} {'apply':>9} {'show':>9} {'tick':>9} {'update':>9} "
          f"{'bound':>9} {'updates':>8} {'ticks':>6}")

    def ms(x: float) -> str:
        return f"{x * 1000:6.2f} ms" if x == x else f"{'-':>9}"

    for r in [*ours, bare]:
        print(f"{r['label']:32} {r['cpu'] * 100:5.1f}% {ms(r['p95_apply'])} "
              f"{ms(r['p95_show'])} {ms(r['p95_tick'])} {ms(r['p95_share'])} "
              f"{ms(r['p95_update'])} {r['count']:8d} {r['redraws']:6d}")
    print()
    for r in ours:
        print(f"{r['label']}: CPU {r['cpu'] / bare['cpu']:.2f}x the bare DataTable's; p95 per "
              f"update {r['p95_share'] / bare['p95_share']:.2f}x, worst bound "
              f"{r['p95_update'] / bare['p95_update']:.2f}x")
    fleet, fleet_sorted, node = ours
    for name, r in (("fleet view", fleet), ("fleet sorted by rate", fleet_sorted)):
        print(f"targets: {name} CPU < 10% of a core: "
              f"{'met' if r['cpu'] < 0.10 else 'MISSED'} ({r['cpu'] * 100:.1f}%); "
              f"p95 per tick < 20 ms: {'met' if r['p95_tick'] < 0.020 else 'MISSED'} "
              f"({r['p95_tick'] * 1000:.1f} ms)")
    print(f"targets: node view CPU < 5%: "
          f"{'met' if node['cpu'] < 0.05 else 'MISSED'} ({node['cpu'] * 100:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
