"""The process group under torchrun: NCCL on GPUs, gloo on the CPU; a single process without.

`fleetdeck-train train` becomes torchrun itself for `[train] nproc` or `nodes` > 1
(trainer/launch.py). With several nodes, node rank 0 leads (writes the checkpoints and the
run's progress, hands its checkpoint to the others on a resume). Every group starts with an
allowance (`[train] join_timeout_s`) for loading, the first steps and their compiles, and at
checkpoints; across nodes, in between, a collective waits at most `[train] node_timeout_s`
(but for a step that compiles a new shape), so that a lost or stuck node stops the job
instead of hanging it for gloo's 30 minutes (trainer/nodewatch.py names a lost node).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

log = logging.getLogger("fleetdeck.train")
T = TypeVar("T")


class NodesError(ValueError):
    """The nodes of a run do not fit together (node ranks, data): exit 2 on every node."""


@dataclass(frozen=True)
class NodeFacts:
    """What one process says about itself at the start (gathered by every process)."""

    node_rank: int
    local_rank: int
    host: str
    run_dir: str

    @property
    def where(self) -> str:
        return f"{self.host}: {self.run_dir}"


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    # fleetdeck's node rank ([train] node_rank, the campaign's order), not torchrun's: the
    # c10d rendezvous numbers the nodes in an order of its own.
    node_rank: int = 0
    nodes: int = 1
    # The global rank of node 0's first process: it writes checkpoints and progress.
    lead: int = 0
    # Every process's facts by global rank (several nodes only).
    facts: tuple[NodeFacts, ...] = ()

    @property
    def main(self) -> bool:
        return self.rank == self.lead

    @property
    def node_main(self) -> bool:
        """The first process of its node: it writes this node's progress.json."""
        return self.local_rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def node(self, node_rank: int) -> NodeFacts | None:
        return next((f for f in self.facts if f.node_rank == node_rank and f.local_rank == 0),
                    None)

    def describe(self, node_rank: int) -> str:
        """'rank 1 of 2 (host: run dir)', as the console and the logs name a node."""
        facts = self.node(node_rank)
        where = f" ({facts.where})" if facts is not None else ""
        return f"rank {node_rank} of {self.nodes}{where}"


def init(nodes: int = 1, node_rank: int = 0, run_dir: str = "",
         startup_timeout_s: float | None = None) -> Dist:
    """Join the process group, which waits `startup_timeout_s` while the processes start
    (prepare, load the target, the first steps); `set_timeout` shortens it once they have."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        if local_world > 1:
            # Share the node's cores instead of each process taking them all (a single
            # process per node keeps what OMP_NUM_THREADS gives it).
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if world > 1 and not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if startup_timeout_s is not None:
            kwargs["timeout"] = timedelta(seconds=startup_timeout_s)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **kwargs)
    d = Dist(rank, world, local, device, node_rank, nodes)
    if nodes <= 1 or world <= 1:
        return d
    mine = NodeFacts(node_rank, local, socket.gethostname(), run_dir)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    facts = tuple(gathered)
    return Dist(rank, world, local, device, node_rank, nodes, lead_of(facts, nodes), facts)


def lead_of(facts: tuple[NodeFacts, ...], nodes: int) -> int:
    """Node 0's first process, after checking that the node ranks are 0..nodes-1, each
    claimed by one node (a campaign's launch numbers them; a hand-written spec may not)."""
    by_node: dict[int, set[str]] = {}
    for f in facts:
        by_node.setdefault(f.node_rank, set()).add(f.where)
    for r, places in sorted(by_node.items()):
        if not 0 <= r < nodes:
            raise NodesError(f"[train] node_rank {r} on {sorted(places)[0]}: outside "
                             f"0..{nodes - 1}")
        if len(places) > 1:
            raise NodesError(f"[train] node_rank {r} is claimed by {len(places)} nodes ("
                             + ", ".join(sorted(places)) + "): each node needs its own rank")
    missing = sorted(set(range(nodes)) - set(by_node))
    if missing:
        raise NodesError(f"[train] node_rank {missing[0]}: no node has it, though nodes = "
                         f"{nodes}; launch every node of the run with its own rank")
    return next(i for i, f in enumerate(facts) if f.node_rank == 0 and f.local_rank == 0)


def set_timeout(seconds: float, d: Dist) -> None:
    """How long a collective waits from now on (this process; every process sets its own)."""
    if not d.enabled:
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timedelta(seconds=seconds))


class Allowance:
    """The collectives' timeout. On one node always `generous_s` (the start-up allowance): a
    rank there is not lost, only slow (a recompile), and a crash ends the job anyway. Across
    nodes `generous_s` for the first `steps` steps, inside `generous()` (a checkpoint, a
    held-out pass that compiles) and for a step in which some rank meets a shape it has not
    compiled yet (`step()`; `recompiles`: the step is compiled, flex attention); `steady_s`
    otherwise, so that a lost node stops the job."""

    def __init__(self, d: Dist, generous_s: float, steady_s: float, steps: int,
                 recompiles: bool = False) -> None:
        self.d, self.generous_s, self.steady_s, self.steps = d, generous_s, steady_s, steps
        self.recompiles = recompiles
        self.steady = False
        self.seen: set[Hashable] = set()

    def after_step(self, done: int) -> None:
        """`done` steps taken by this run (this invocation): past the start-up ones, steady
        (across nodes)."""
        if not self.steady and done >= self.steps and self.d.enabled and self.d.nodes > 1:
            self.steady = True
            set_timeout(self.steady_s, self.d)
            log.info("start-up over after %d steps: collectives wait at most %g s", done,
                     self.steady_s)

    @contextlib.contextmanager
    def step(self, shapes: Iterable[Hashable]) -> Iterator[bool]:
        """One training step whose compiled inputs have `shapes` on this rank; yields True
        where the step waits `generous_s` because a rank meets a shape new to it (and
        compiles: tens of seconds while the others wait in a collective). Steady, every rank
        says whether it has a new one in one all-reduce before the step's collectives, so
        that all agree; before that, nothing to agree on (generous anyway)."""
        new = set(shapes) - self.seen if self.recompiles else set()
        self.seen |= new
        if not (self.steady and self.recompiles):
            yield False
        elif any_rank(bool(new), self.d):
            log.info("a new shape on some rank (here: %s): this step waits at most %g s",
                     sorted(map(str, new)) or "none", self.generous_s)
            with self.generous():
                yield True
        else:
            yield False

    @contextlib.contextmanager
    def generous(self) -> Iterator[None]:
        if self.steady:
            set_timeout(self.generous_s, self.d)
        try:
            yield
        finally:
            if self.steady:
                set_timeout(self.steady_s, self.d)


def from_lead(obj: T | None, d: Dist) -> T:
    """The lead's `obj`, on every process (pickled; the others pass None)."""
    box: list[Any] = [obj]
    if d.enabled:
        dist.broadcast_object_list(box, src=d.lead)
    if box[0] is None:
        raise NodesError(f"rank {d.rank}: nothing came from the lead (rank {d.lead})")
    result: T = box[0]
    return result


def gather(obj: T, d: Dist) -> list[T]:
    """Every process's `obj`, by global rank."""
    if not d.enabled:
        return [obj]
    out: list[Any] = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def all_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Sum a tensor over ranks (through the device the backend wants)."""
    if not d.enabled:
        return t
    moved = t.to(d.device)
    dist.all_reduce(moved, op=dist.ReduceOp.SUM)
    return moved.to(t.device)


def any_rank(flag: bool, d: Dist) -> bool:
    if not d.enabled:
        return flag
    return bool(all_sum(torch.tensor([1.0 if flag else 0.0]), d)[0] > 0)


def barrier(d: Dist, patience_s: float | None = None, usual_s: float | None = None) -> None:
    """Wait for every process; `patience_s` for this one wait (the lead may be writing a large
    checkpoint), then back to `usual_s`."""
    if not d.enabled:
        return
    if patience_s is not None:
        set_timeout(patience_s, d)
    dist.barrier()
    if patience_s is not None and usual_s is not None:
        set_timeout(usual_s, d)


def close(d: Dist) -> None:
    """Leave the group, every rank at once: a barrier first, as PyTorch's maintainers advise
    (pytorch#75097: destroy_process_group hangs now and then where ranks reach it apart; ci
    here: of a two-rank CPU run one rank gone, the other idle for nine minutes). Only on the
    way out of a run every rank finished."""
    if d.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
