"""A campaign as one work queue in S3 (agents/queue): its time to done against the ideal, and
what `verify` reads to prove it.

1. Time to done. 4 local nodes on one campaign prefix of a local SeaweedFS, each with its own
   2 simulators and its own engine process (`fleetdeck-agent generate` with a [queue]
   section), one node's simulators 3x slower. Time to done: the engines started -> the last
   chunk's commit in S3 (its `committed_at`).

   The ideal is every node busy from its own start to one common end. Node k's rate r_k is
   its completions per second while it was fed (a full round of lines waiting beyond those
   out, so every slot had its next line), summed over consecutive progress.json writes that
   were both fed, from once its slots had answered a round; its start s_k is the write before
   the first with a request out. The ideal end T solves sum_k r_k (T - s_k) = prompts. It is
   fair because each rate is that node's own, measured in this run under this run's load
   (the other nodes, S3, the simulators and the queue's own work on the same cores), and each
   node's start-up as it really was is in it. What the ideal leaves out is what a perfect
   scheduler would not have: slots idle at the tail, copies that lose (backups, hedges), and
   the last commit's own latency; all of it is charged to the queue. The same rates give, for
   context, the old static partition left alone (prompts / 4 a node: it ends with the slow
   one's share). The reference printed is the static partition's own benchmark
   (benchmarks/campaign.py, same prompts and speeds), whose ideal left launch out.

2. Verify's reads. `verify` (agents/queue/union.py) reads the commit objects and HEADs the
   batches they name; with deep=1.0 it also reads every batch body. Bytes read against the
   bytes the batches hold, both ways.

    .venv/bin/python benchmarks/queue_campaign.py [--prompts 2400] [--scale 0.2] [--chunk-size 50]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.queue.union import read_union, verify  # noqa: E402
from tests.engine.runs import write_prompts  # noqa: E402
from tests.queue.nodes import Node, make_node, prefix_for  # noqa: E402
from tests.servers.ports import wait_until  # noqa: E402
from tests.servers.s3 import S3Server, start_s3  # noqa: E402

NODES = 4
SIMS_PER_NODE = 2
SLOW = 3.0  # the slow node's simulators take this many times as long
POLL_S = 0.1
# benchmarks/campaign.py at 52b5827, on the same setup with static shards.
REFERENCE = ("reference, static partition (benchmarks/campaign.py at 52b5827, 2,400 prompts, "
             "same speeds): rebalance --auto / left alone: 0.535x (ideal 0.400x), i.e. 1.34x "
             "the ideal time")


@dataclass
class Sample:
    t: float  # seconds since the engines started, as of the progress.json write
    resolved: int  # lines written + failed here
    in_flight: int
    capacity: int  # the node's slots: its servers' limits
    waiting: int  # lines of its held chunks not yet resolved, less those in flight

    @property
    def fed(self) -> bool:
        """A full round of lines waiting beyond those out: every slot has its next line."""
        return self.capacity > 0 and self.waiting >= self.capacity


@dataclass
class Trace:
    node: Node
    wall0: float
    samples: list[Sample] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)

    def poll(self) -> None:
        p = self.node.progress()
        if p is None or p.get("updated_at") == self.last.get("updated_at"):
            return
        self.last = p
        q = p.get("queue") or {}
        capacity = sum(s["limit"] for s in p["servers"].values())
        self.samples.append(Sample(p["updated_at"] - self.wall0, p["completed"] + p["failed"],
                                   p["in_flight"], capacity,
                                   q.get("to_do_here", 0) - p["in_flight"]))

    def start(self) -> float | None:
        """The write before the first with a request out (the earliest it could have left);
        None if it never sent one."""
        before = 0.0
        for s in self.samples:
            if s.in_flight or s.resolved:
                return before
            before = s.t
        return None

    def rate(self) -> tuple[float, float] | None:
        """(completions per second while fed, seconds fed), counted over consecutive writes
        both fed, from once its slots have answered a round; None if it never sent."""
        if self.start() is None:
            return None
        lines, seconds = 0, 0.0
        for a, b in itertools.pairwise(self.samples):
            if a.fed and b.fed and a.resolved >= a.capacity:
                lines += b.resolved - a.resolved
                seconds += b.t - a.t
        if seconds >= 1.0 and lines > 0:
            return lines / seconds, seconds
        # Too small a run to have been fed a second: its whole time from its start.
        s0 = self.start()
        assert s0 is not None
        end = next(s for s in self.samples if s.resolved == self.samples[-1].resolved)
        return end.resolved / max(end.t - s0, 1e-9), end.t - s0


def ideal_end(rates: list[float], starts: list[float], prompts: int) -> float:
    """T with sum r_k (T - s_k) = prompts: every node busy from its start to T."""
    return (prompts + sum(r * s for r, s in zip(rates, starts, strict=True))) / sum(rates)


def run_campaign(args: argparse.Namespace, root: Path, s3: S3Server) -> list[Trace]:
    prompts = root / "prompts.jsonl"
    write_prompts(prompts, args.prompts)  # the same bytes on every node
    nodes = []
    try:
        for k in range(NODES):
            scale = args.scale * (SLOW if k == NODES - 1 else 1.0)
            nodes.append(make_node(root, f"node-{k}", prompts, s3, sims=SIMS_PER_NODE,
                                   time_scale=scale, lease_s=args.lease, poll_s=args.poll,
                                   chunk_size=args.chunk_size, seed=k * SIMS_PER_NODE,
                                   max_tokens=args.max_tokens, batch_size=args.batch_size,
                                   concurrency_per_server=args.concurrency,
                                   request_timeout_s=max(30.0, 600 * args.scale)))
        env = {**s3.env(), "FLEETDECK_JOURNAL_INTERVAL_S": "1"}
        wall0 = time.time()
        traces = [Trace(n, wall0) for n in nodes]
        for n in nodes:
            n.start(env)

        def over() -> bool:
            for tr in traces:
                tr.poll()
            return all(n.engine is not None and n.engine.proc.poll() is not None for n in nodes)

        wait_until(over, args.timeout, "every node's engine exits", interval=POLL_S)
        exited = time.time() - wall0
        for n in nodes:
            assert n.engine is not None
            rc = n.engine.proc.returncode
            if rc != 0 or not (n.progress() or {}).get("queue", {}).get("finished"):
                raise RuntimeError(f"{n.name}: exited {rc}, queue not finished:\n{n.logs()}")
        u = read_union(s3.client(), s3.bucket, prefix_for(root))
        commits = [c for g in u.commits.values() for c in g.values()]
        done_s = max(c.committed_at for c in commits) - wall0
        report(args, traces, done_s, exited, commits)
        return traces
    finally:
        for n in nodes:
            n.stop()


def report(args: argparse.Namespace, traces: list[Trace], done_s: float, exited: float,
           commits: list[Any]) -> None:
    rates: list[float | None] = []
    starts: list[float | None] = []
    for tr in traces:
        got, s0 = tr.rate(), tr.start()
        rates.append(got[0] if got else None)
        starts.append(s0)
        q = tr.last.get("queue") or {}
        by = sum(1 for c in commits if c.node == tr.node.name)
        head = (f"first request by {s0:5.2f} s; {got[0]:6.2f} lines/s over {got[1]:5.1f} s fed"
                if got and s0 is not None else
                "never sent a request (the work was gone): left out of the ideal")
        print(f"  {tr.node.name}: {head}; {tr.last.get('completed', 0):5,} lines, {by:3} chunks "
              f"committed, {q.get('lost', 0)} lost, {q.get('backups', 0)} backups, "
              f"{q.get('taken_over', 0)} takeovers, {tr.last.get('hedges', 0)} hedges")
    worked = [(r, s) for r, s in zip(rates, starts, strict=True) if r is not None and s is not None]
    ideal = ideal_end([r for r, _ in worked], [s for _, s in worked], args.prompts)
    lines = sum(tr.last.get("completed", 0) + tr.last.get("failed", 0) for tr in traces)
    backups = sum((tr.last.get("queue") or {}).get("backups", 0) for tr in traces)
    takeovers = sum((tr.last.get("queue") or {}).get("taken_over", 0) for tr in traces)
    fast = [r for r in rates[:-1] if r is not None]
    if fast and rates[-1] is not None:
        print(f"slow node's rate / fast nodes' mean: {rates[-1] / statistics.mean(fast):.3f} "
              f"(simulators 1/{SLOW:g})")
    print(f"lines generated: {lines:,} for {args.prompts:,} prompts "
          f"({lines - args.prompts:,} beyond: copies that lost)")
    print(f"backups: {backups}; takeovers: {takeovers}")
    print(f"time to done (last commit in S3): {done_s:.1f} s (every engine exited by "
          f"{exited:.1f} s)")
    print(f"ideal (every node busy from its start to one end): {ideal:.1f} s")
    if len(worked) == NODES:
        static = max(s + args.prompts / NODES / r for r, s in worked)
        print(f"static partition left alone, from the same rates: {static:.1f} s "
              f"(ideal / it: {ideal / static:.3f}x; time to done / it: {done_s / static:.3f}x)")
    print(f"ratio time to done / ideal: {done_s / ideal:.2f}x")
    print(REFERENCE)


def verify_reads(s3: S3Server, prefix: str, prompts: int) -> None:
    for deep, label in ((0.0, "commits, HEADs only"), (1.0, "deep=1.0")):
        t = time.monotonic()
        v = verify(s3.client(), s3.bucket, prefix, deep=deep, seed=0)
        took = time.monotonic() - t
        if not v.ok or v.done + v.failed != prompts:
            raise RuntimeError(f"verify ({label}): {v.summary()}; {v.problems[:5]}")
        print(f"verify ({label}): {v.bytes_read:,} bytes read for {v.batch_bytes:,} in "
              f"{v.batches} batches ({v.committed} commits, {v.heads} HEADs, {v.deep_read} "
              f"bodies) in {took:.2f} s")
        name = "verify" if deep == 0 else "verify deep=1.0"
        print(f"ratio {name} bytes read / batch bytes: {v.bytes_read / v.batch_bytes:.4f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2400, help="the whole campaign's")
    ap.add_argument("--scale", type=float, default=0.2,
                    help="the fast simulators' wall seconds per simulated second")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=4, help="per server")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--chunk-size", type=int, default=50, help="[queue] chunk_size")
    ap.add_argument("--lease", type=float, default=60.0, help="[queue] lease_s")
    ap.add_argument("--poll", type=float, default=1.0, help="[queue] poll_s")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for the campaign")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fd-bench-queue-") as d:
        bench(args, Path(d))


def bench(args: argparse.Namespace, root: Path) -> None:
    s3 = start_s3(root / "s3")
    try:
        print(f"{NODES} local nodes x {SIMS_PER_NODE} simulators, node-{NODES - 1}'s "
              f"{SLOW:g}x slower (time scale {args.scale:g} / {args.scale * SLOW:g}); "
              f"{args.prompts:,} prompts in chunks of {args.chunk_size}, max_tokens "
              f"{args.max_tokens}, {args.concurrency} per server; lease {args.lease:g} s, "
              f"poll {args.poll:g} s")
        campaign = root / "campaign"
        campaign.mkdir()
        run_campaign(args, campaign, s3)
        verify_reads(s3, prefix_for(campaign), args.prompts)
    finally:
        s3.kill()


if __name__ == "__main__":
    os.environ.setdefault("FLEETDECK_PROGRESS_INTERVAL_S", "0.2")
    main()
