"""Where an event loop's stalls come from: the engine run with a stall sampler beside it.

A task on the loop notes the time and the loop thread's CPU time every BEAT_S; a thread looks
every SAMPLE_S and, while the last beat is older than LATE_S, takes the main thread's stack.
Each stall (the gap between two beats) is written as one JSON line: when, how long, how much
of it the loop thread ran (the rest it waited for a CPU: on a loaded box, the box's share),
and its most frequent stacks (the innermost frames). Only for finding out: the beat and the
sampling cost the engine a little CPU, so figures measured with it are not the engine's.

    cmd = traced_cmd(["generate", spec], trace_path)   # instead of `-m agents.cli ...`
    for stall in read_stalls(trace_path, min_ms=50): ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

BEAT_S = 0.005
SAMPLE_S = 0.004
LATE_S = 0.02
FRAMES = 14
GC_MIN_S = 0.005  # garbage collections at least this long are written too

TRACER = r'''
import asyncio, collections, gc, json, os, runpy, sys, threading, time, traceback
BEAT_S, SAMPLE_S, LATE_S, FRAMES, GC_MIN_S = {beat!r}, {sample!r}, {late!r}, {frames!r}, {gc!r}
out = open({path!r}, "w", buffering=1)
t0 = time.monotonic()
beat = [None]  # (monotonic, the loop thread's CPU s) at the last beat; None before the loop
main_id = threading.get_ident()
from agents.engine import looplag
probe_run = looplag.LoopLag.run

async def heartbeat():
    while True:
        beat[0] = (time.monotonic(), time.thread_time())
        await asyncio.sleep(BEAT_S)

async def run(self):
    task = asyncio.get_running_loop().create_task(heartbeat())
    try:
        await probe_run(self)
    finally:
        task.cancel()

looplag.LoopLag.run = run

def sampler():
    start, stacks = None, collections.Counter()
    while True:
        time.sleep(SAMPLE_S)
        last = beat[0]
        if last is None:
            continue
        if start is not None and last is not start:
            out.write(json.dumps({{"at_s": round(start[0] - t0, 3),
                                  "ms": round((last[0] - start[0] - BEAT_S) * 1000, 1),
                                  "cpu_ms": round((last[1] - start[1]) * 1000, 1),
                                  "stacks": stacks.most_common(4)}}) + "\n")
            start, stacks = None, collections.Counter()
        if time.monotonic() - last[0] < LATE_S:
            continue
        start = last
        frame = sys._current_frames().get(main_id)
        if frame is not None:
            stacks[" < ".join(f"{{os.path.basename(f.filename)}}:{{f.lineno}} {{f.name}}"
                              for f in reversed(traceback.extract_stack(frame)[-FRAMES:]))] += 1

gc_start = [0.0, 0.0]

def gc_watch(phase, info):
    # A collection holds the GIL throughout: the sampler sees nothing of it, so it is timed.
    if phase == "start":
        gc_start[:] = time.monotonic(), time.thread_time()
    elif (took := time.monotonic() - gc_start[0]) >= GC_MIN_S:
        out.write(json.dumps({{"gc": info["generation"], "at_s": round(gc_start[0] - t0, 3),
                              "ms": round(took * 1000, 1),
                              "cpu_ms": round((time.thread_time() - gc_start[1]) * 1000, 1),
                              "collected": info["collected"]}}) + "\n")

gc.callbacks.append(gc_watch)
threading.Thread(target=sampler, daemon=True).start()
sys.argv = ["fleetdeck-agent", *{args!r}]
runpy.run_module("agents.cli", run_name="__main__")
'''


def traced_cmd(args: list[str], path: Path) -> list[str]:
    """The command line of `fleetdeck-agent ARGS` with the sampler, writing to `path`."""
    code = TRACER.format(beat=BEAT_S, sample=SAMPLE_S, late=LATE_S, frames=FRAMES, gc=GC_MIN_S,
                         path=str(path), args=args)
    return [sys.executable, "-c", code]


def read_stalls(path: Path, min_ms: float = 0.0) -> tuple[list[dict[str, Any]],
                                                          list[dict[str, Any]]]:
    """(the stalls of at least `min_ms`, longest first; every collection written)."""
    stalls, collections = [], []
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "gc" in rec:
                collections.append(rec)
            elif rec["ms"] >= min_ms:
                stalls.append(rec)
    return sorted(stalls, key=lambda s: -s["ms"]), collections


def _frame(f: str) -> str:
    place, _, name = f.partition(" ")
    return f"{place.split(':', 1)[0]} {name}"


def summary(stalls: list[dict[str, Any]], collections: list[dict[str, Any]],
            top: int = 8) -> str:
    """The longest stalls: the loop's CPU in each, the collections in them and the stacks
    they were caught in (innermost frame first); then the frames most often innermost."""
    lines = []
    for s in stalls[:top]:
        end = s["at_s"] + s["ms"] / 1000 + BEAT_S
        gcs = [c for c in collections if s["at_s"] <= c["at_s"] <= end]
        in_gc = (f"; {sum(c['ms'] for c in gcs):.0f} ms ({sum(c['cpu_ms'] for c in gcs):.0f} "
                 f"CPU) in {len(gcs)} garbage collection(s) of generation "
                 f"{max(c['gc'] for c in gcs)}" if gcs else "")
        lines.append(f"  {s['ms']:.0f} ms ({s['cpu_ms']:.0f} ms of it the loop's own CPU"
                     f"{in_gc}) at {s['at_s']:.1f} s:")
        for stack, n in s["stacks"][:2]:
            lines.append(f"    {n} x {stack}")
    if stalls:
        worst = max(stalls, key=lambda s: s["cpu_ms"])
        lines.append(f"  the most loop CPU in one: {worst['cpu_ms']:.0f} ms (a {worst['ms']:.0f} "
                     f"ms stall at {worst['at_s']:.1f} s)")
    if collections:
        for gen in sorted({c["gc"] for c in collections}):
            these = [c for c in collections if c["gc"] == gen]
            longest = max(these, key=lambda c: c["cpu_ms"])
            lines.append(f"  generation {gen} collections over {GC_MIN_S * 1000:.0f} ms: "
                         f"{len(these)}, the most CPU in one {longest['cpu_ms']:.0f} ms ("
                         f"{longest['ms']:.0f} ms, at {longest['at_s']:.1f} s)")
    leaves: dict[str, int] = {}
    for s in stalls:
        for stack, n in s["stacks"]:
            leaf = _frame(stack.split(" < ", 1)[0])
            leaves[leaf] = leaves.get(leaf, 0) + n
    common = sorted(leaves.items(), key=lambda kv: -kv[1])[:10]
    lines.append("  innermost frames most often sampled in them: "
                 + ", ".join(f"{f} {n}" for f, n in common))
    return "\n".join(lines)
