"""A campaign across nodes: the time to finish with and without rebalancing, and the console's
CPU for a campaign of 32 nodes x 8 GPUs.

1. Moving the tail. 4 local "nodes" (supervised runs, each with its own run dir and local
   agent, launched as one campaign by `fleetdeck launch`), 2 simulators each, one node's
   simulators 3x slower; SeaweedFS S3 from console/seaweed.py. The same prompt set, once left
   alone (the baseline: the campaign ends with its slow shard) and once with `fleetdeck
   rebalance --auto` alongside. Prints both times and their ratio, and the ideal ratio (every
   node busy to the end: 4 / (3 x 3 + 1) = 0.4, launch and its overhead aside).

2. The console's CPU. Synthetic snapshots of 8 servers each (tests/console/data.py) for a
   campaign of 32 nodes: per refresh, the snapshots decoded into the fleet state, the roll-up,
   the TUI's campaign row and node rows, and a rebalance plan; CPU seconds per refresh against
   the same for one node.

    .venv/bin/python benchmarks/campaign.py [--prompts 2400] [--scale 0.2] [--skip-run]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from console.campaign import from_state  # noqa: E402
from console.campaign_rebalance import AutoRebalance  # noqa: E402
from console.fleet import Campaign, Fleet, Node  # noqa: E402
from console.seaweed import start_s3  # noqa: E402
from console.state import FleetState  # noqa: E402
from tests.console import data as d  # noqa: E402
from tests.engine.runs import write_prompts, write_spec  # noqa: E402
from tests.plugins.supervised import kill_run  # noqa: E402
from tests.servers.ports import kill_pid, wait_until  # noqa: E402
from tests.simserver import start_sim  # noqa: E402

NODES = 4
SIMS_PER_NODE = 2
SLOW = 3.0  # the slow node's simulators take this many times as long


# -- 1. moving the tail ----------------------------------------------------------------------------

def fleetdeck(fleet: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def progress(run_dir: Path) -> dict[str, Any] | None:
    try:
        out: dict[str, Any] = json.loads((run_dir / "progress.json").read_text())
        return out
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def trial(root: Path, name: str, args: argparse.Namespace, urls: list[list[str]], s3: Any,
          rebalance: bool) -> dict[str, Any]:
    """One campaign from launch to every index done; seconds and what moved."""
    folder = root / name
    agent = " ".join(["env", *(f"{k}={v}" for k, v in s3.env().items()),
                      shlex.quote(sys.executable), "-m", "agents.cli"])
    text, run_dirs = "", []
    for k in range(NODES):
        node = folder / f"node-{k}"
        node.mkdir(parents=True)
        write_prompts(node / "prompts.jsonl", args.prompts)  # the same bytes on every node
        spec = write_spec(node / "run.toml", node / "prompts.jsonl", urls[k], s3=s3,
                          max_tokens=args.max_tokens, batch_size=args.batch_size,
                          concurrency_per_server=args.concurrency)
        spec.write_text(spec.read_text().replace('prefix = "runs/test/"',
                                                 f'prefix = "bench/{name}/"'))
        run_dirs.append(node / "run")
        text += (f'[[nodes]]\nname = "node-{k}"\nlocal = true\nrun_dir = "{node / "run"}"\n'
                 f'agent = "{agent}"\nspec = "{spec}"\n')
    text += ('[[campaigns]]\nname = "bench"\nnodes = [' +
             ", ".join(f'"node-{k}"' for k in range(NODES)) + "]\n")
    fleet = folder / "fleet.toml"
    fleet.write_text(text)
    start = time.monotonic()
    r = fleetdeck(fleet, "launch", "bench", "--yes")
    if r.returncode != 0:
        raise RuntimeError(f"{name}: launch failed:\n{r.stdout}{r.stderr}")
    mover = None
    if rebalance:
        mover = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "--fleet", str(fleet), "rebalance", "bench",
             "--yes", "--auto", "--interval", "1", "--min", str(args.min)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    done_at: dict[int, float] = {}

    def finished() -> bool:
        total = 0
        for k, rd in enumerate(run_dirs):
            p = progress(rd)
            if p is None:
                return False
            total += p["completed"] + p["failed"]
            if p["status"] == "done" and p["completed"] + p["failed"] >= p["total"]:
                done_at.setdefault(k, time.monotonic() - start)
            else:
                done_at.pop(k, None)
        return total >= args.prompts and len(done_at) == NODES

    try:
        wait_until(finished, 1800, f"{name}: every node done", interval=0.1)
        seconds = time.monotonic() - start
        moved = ""
        if mover is not None:
            out, err = mover.communicate(timeout=120)
            if mover.returncode != 0:
                raise RuntimeError(f"{name}: rebalance --auto exited {mover.returncode}:\n"
                                   f"{out}{err}")
            moved = "; ".join(line for line in out.splitlines() if line.startswith("moved"))
        return {"seconds": seconds, "moved": moved, "done_at": dict(sorted(done_at.items()))}
    finally:
        if mover is not None and mover.poll() is None:
            mover.kill()
        for rd in run_dirs:
            subprocess.run([sys.executable, "-m", "agents.cli", "down", str(rd), "--yes"],
                           capture_output=True, timeout=60, cwd=ROOT)
            kill_run(rd)


def moving_the_tail(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="fd-bench-campaign-"))
    s3 = start_s3(root / "s3")
    sims = []
    try:
        urls: list[list[str]] = []
        for k in range(NODES):
            scale = args.scale * (SLOW if k == NODES - 1 else 1.0)
            node_urls = []
            for i in range(SIMS_PER_NODE):
                sim = start_sim(root, "--time-scale", str(scale), "--load-seconds", "0",
                                "--seed", str(k * SIMS_PER_NODE + i), name=f"sim{k}-{i}")
                sims.append(sim)
                node_urls.append(sim.url)
            urls.append(node_urls)
        print(f"{NODES} local nodes x {SIMS_PER_NODE} simulators, node-{NODES - 1}'s "
              f"{SLOW:g}x slower (time scale {args.scale} / {args.scale * SLOW}); "
              f"{args.prompts:,} prompts ({args.prompts // NODES:,} a shard), max_tokens "
              f"{args.max_tokens}, {args.concurrency} per server; rebalance --min {args.min}")
        alone = trial(root, "alone", args, urls, s3, rebalance=False)
        moved = trial(root, "rebalanced", args, urls, s3, rebalance=True)
    finally:
        for sim in sims:
            kill_pid(sim.proc)
        s3.kill()
    for label, t in (("left alone", alone), ("rebalance --auto", moved)):
        ends = ", ".join(f"node-{k} {s:.1f}" for k, s in t["done_at"].items())
        print(f"{label:18} every node done in {t['seconds']:6.1f} s (each done at: {ends} s)")
    if moved["moved"]:
        print(f"moves: {moved['moved']}")
    # Every node busy to the end: the fast nodes' pace is SLOW times the slow one's.
    ideal = NODES / (NODES - 1 + 1 / SLOW) / SLOW
    print(f"ratio time to finish, rebalance --auto / left alone: "
          f"{moved['seconds'] / alone['seconds']:.3f}x (ideal, launch overhead aside: "
          f"{ideal:.3f}x)")


# -- 2. the console's CPU --------------------------------------------------------------------------

def synthetic(n: int) -> tuple[Fleet, Campaign, list[bytes]]:
    """A campaign of n nodes, 8 servers each, its snapshots as they come off the wire."""
    names = [f"gen-{k:02d}" for k in range(n)]
    campaign = Campaign("traces", names, rebalance="auto")
    fleet = Fleet(nodes=[Node(name=x, run_dir=f"/r/{x}", host="h") for x in names],
                  campaigns=[campaign], source="bench")
    raws = []
    for k in range(n):
        total = 10_000_000 // n
        p = d.progress(run="traces", shard=f"{k}/{n}", campaign="traces", total=total,
                       completed=total * (k + 1) // (n + 1), rate_per_sec=14.0 + k % 5,
                       eta_hours=1.0 + k / n,
                       ownership={"cedes": [], "adopts": [], "s3_behind": False})
        p["servers"] = {str(g): dict(p["servers"]["0"], url=f"http://127.0.0.1:{30000 + g}")
                        for g in range(8)}
        snap = d.generate_snapshot(run="traces", progress=p,
                                   servers=[d.server(g) for g in range(8)])
        raws.append(msgspec.json.encode(snap))
    return fleet, campaign, raws


def refresh_cpu(n: int, rounds: int) -> dict[str, float]:
    """CPU seconds per refresh, by part, for a campaign of n nodes."""
    from console.tui.widgets.fleet_table import campaign_row, fleet_row
    from themes.palette import THEMES

    theme = THEMES[0]
    fleet, campaign, raws = synthetic(n)
    state = FleetState(fleet, clock=lambda: d.NOW)
    for ns in state.nodes.values():
        ns.link = "connected"

    async def never(node: str, method: str, params: dict[str, Any]) -> Any:
        raise AssertionError("the benchmark's plan moves nothing")

    rebalancer = AutoRebalance(fleet, campaign, never, print, print)
    parts = {"decode": 0.0, "roll-up": 0.0, "campaign row": 0.0, "node rows": 0.0,
             "rebalance plan": 0.0}
    from console.campaign_rebalance import plan

    for _ in range(rounds):
        t = time.process_time()
        for name, raw in zip(campaign.nodes, raws, strict=True):
            state.apply(name, raw)
        t1 = time.process_time()
        r = from_state(state, campaign)
        t2 = time.process_time()
        campaign_row(r, theme)
        t3 = time.process_time()
        for name in campaign.nodes:
            fleet_row(state.nodes[name], d.NOW, theme, campaign.shard(name))
        t4 = time.process_time()
        p = plan(fleet, campaign, rebalancer.members(state), 0, 1000)
        t5 = time.process_time()
        assert p.empty and p.answered, p.notes
        for key, dt in zip(parts, (t1 - t, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            parts[key] += dt
    return {k: v / rounds for k, v in parts.items()}


def console_cpu(args: argparse.Namespace) -> None:
    one = refresh_cpu(1, args.rounds * 8)
    many = refresh_cpu(32, args.rounds)
    print(f"console CPU per refresh (campaign of 32 nodes x 8 GPUs vs 1 node; "
          f"{args.rounds} refreshes):")
    for key in one:
        print(f"  {key:15} {many[key] * 1e3:8.3f} ms  (1 node {one[key] * 1e3:6.3f} ms, "
              f"{many[key] / one[key]:5.1f}x)")
    total_one, total_many = sum(one.values()), sum(many.values())
    print(f"  {'all':15} {total_many * 1e3:8.3f} ms  (1 node {total_one * 1e3:6.3f} ms)")
    print(f"ratio console CPU per refresh, 32 nodes / 1 node: {total_many / total_one:.1f}x "
          f"({total_many / total_one / 32:.2f}x per node); at one refresh a second, "
          f"{100 * total_many:.1f}% of a core")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2400, help="the whole campaign's")
    ap.add_argument("--scale", type=float, default=0.2,
                    help="the fast simulators' wall seconds per simulated second")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=4, help="per server")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--min", type=int, default=100, help="rebalance --min")
    ap.add_argument("--rounds", type=int, default=50, help="refreshes timed (32 nodes)")
    ap.add_argument("--skip-run", action="store_true", help="the console's CPU only")
    args = ap.parse_args()
    if not args.skip_run:
        moving_the_tail(args)
    console_cpu(args)


if __name__ == "__main__":
    os.environ.setdefault("FLEETDECK_PROGRESS_INTERVAL_S", "0.2")
    main()
