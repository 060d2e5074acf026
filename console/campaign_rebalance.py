"""`fleetdeck rebalance CAMPAIGN --yes`: move the tail of a slow shard to a node that is done.

A move is two steps, each one node's own audited call: the slow node cedes `count` of its
to-do indices (journaled there before it answers; it never sends them again), then the idle
node adopts the ranges it answered under the same id (journaled there before it sends one).
The engine makes each step durable and idempotent by id. This side keeps the rest of the
promise: a move's id is made once, here, and names the node the move is for; every round
first finishes each cede that no node adopted (its ranges asked again of the node that ceded,
under the same id, which answers the same record; adopted on the node its id names, else on
the idlest node, and never while a node that may hold its adopt does not answer). A crash or
SIGKILL of either node or of this console between the steps thus loses
nothing and sends nothing twice.

FLEETDECK_CONSOLE_CRASH_AT=between_cede_and_adopt (tests): the console SIGKILLs itself after a
cede has answered and before its adopt is sent.

The plan is pure (`plan`); `carry_out` does it through any `call(node, method, params)`, so
the headless verb and the TUI (`[[campaigns]] rebalance = "auto"`) share one logic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agents.rpc.protocol import NO_ANSWER, RpcError
from agents.rundir.schema import Snapshot
from console.campaign import Member, roll_up
from console.fleet import Campaign, Fleet
from console.given_back import with_given_back
from console.headless import EXIT_CHECK, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, open_link
from console.sanitize import shown
from console.state import FleetState
from console.transport import AgentLink, Unreachable

CRASH_ENV = "FLEETDECK_CONSOLE_CRASH_AT"
CRASH_POINTS = ("between_cede_and_adopt",)

DEFAULT_MIN = 1000  # two batches of the default batch_size (500): less is not worth a move
GIVES = ("running",)  # a node that cedes: sending now (a paused or stopping one is left be)
TAKES = ("done", "running", "starting")  # a node that may adopt (never a failed or stopped)
LIVE = ("running", "starting", "paused", "draining")
# An engine younger than this with no rate yet (none measured, no mean: its first progress)
# is warming up and gives nothing: a node restarted by the adopt of a move, read half a second
# later, would otherwise look as slow as a guess and hand half of what it was given back.
WARMUP_S = 30.0
REASSIGN_PREFIX = "reassign-"  # the id of a dead node's shard taken over (campaign_verify)
CALL_TIMEOUT_S = 150.0  # an adopt on a node whose engine is ending waits for it (up to 120 s)

Call = Callable[[str, str, dict[str, Any]], Awaitable[Any]]
Say = Callable[[str], None]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # as the agent's adopt takes it
_TARGET = re.compile(r"-(\d+)to(\d+)$")


def crash_point(name: str) -> None:
    """Tests: SIGKILL this console at crash point `name` when FLEETDECK_CONSOLE_CRASH_AT says
    so (between_cede_and_adopt: the cede answered, its adopt not sent)."""
    if os.environ.get(CRASH_ENV) == name:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


# -- the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Load:
    """One node of the campaign as the plan sees it."""

    node: str
    status: str
    shard: str | None  # the shard its run owns ("1/4"), as adopts record where indices came from
    left: int  # owned, neither done nor failed (in flight counts as left)
    rate: float | None  # completions per second (None: not known)
    warming: bool = False  # just started, no rate of its own yet: not a giver
    leaving: bool = False  # passed decommission-check (or given back): takes nothing


@dataclass(frozen=True, slots=True)
class Readopt:
    """A cede no node adopted: its ranges, asked again of `ceder` under `id`, go to `to`."""

    id: str
    ceder: str
    count: int
    to: str


@dataclass(frozen=True, slots=True)
class Move:
    id: str
    slow: str
    idle: str
    count: int


@dataclass(slots=True)
class Plan:
    readopts: list[Readopt] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what waits, and why
    loads: dict[str, Load] = field(default_factory=dict)
    answered: bool = False  # every node's figures are known
    waiting: int = 0  # cedes nobody adopted that this round cannot finish (see notes)

    @property
    def empty(self) -> bool:
        return not self.readopts and not self.moves


def load_of(member: Member) -> Load | None:
    snap = member.snapshot
    p = snap.progress if snap is not None else None
    if snap is None or p is None:
        return None
    rate: float | None = p.rate_per_sec if p.rate_per_sec > 0 else None
    if rate is None and p.completed > 0 and p.elapsed_hours > 0:
        # A finished run's mean. A resumed engine's is high (completed counts every engine,
        # elapsed this one): it gives less, and hardly ever bounces work back.
        rate = p.completed / (p.elapsed_hours * 3600)
    warming = rate is None and p.elapsed_hours * 3600 < WARMUP_S
    left = max(0, p.total - p.completed - p.failed)
    return Load(member.node, snap.status, p.shard, left, rate, warming, member.leaving)


def move_id(campaign: Campaign, slow: str, idle: str, now_ms: int) -> str:
    """`rb-<campaign>-<unix ms>-<K>to<J>`: made once per move; K and J are the nodes' places
    in the campaign (their shards), so the id names the node the move is for."""
    tail = f"-{now_ms}-{campaign.position(slow)}to{campaign.position(idle)}"
    name = _SAFE.sub("_", campaign.name)[: 128 - 3 - len(tail)]
    return f"rb-{name}{tail}"


def target_of(campaign: Campaign, cede_id: str, ceder: str) -> str | None:
    """The node a rebalance move's id names as its adopter; None for an id of another kind
    (or one whose K is not the node that ceded it)."""
    m = _TARGET.search(cede_id)
    if m is None or not cede_id.startswith("rb-"):
        return None
    k, j = int(m.group(1)), int(m.group(2))
    if j >= len(campaign.nodes) or k >= len(campaign.nodes) or campaign.nodes[k] != ceder:
        return None
    return campaign.nodes[j]


def reassigned(members: Sequence[Member], silent: list[str]) -> dict[str, str]:
    """Silent nodes whose shard another node took over (`fleetdeck reassign`: an adopt whose id
    is `reassign-...`, from that node): out of the campaign for good, so they hold nothing
    back. Node -> the adopt's id."""
    out: dict[str, str] = {}
    for m in members:
        p = m.snapshot.progress if m.snapshot is not None else None
        if p is None or p.ownership is None:
            continue
        for a in p.ownership.adopts:
            if a.id.startswith(REASSIGN_PREFIX) and a.node in silent:
                out.setdefault(a.node, a.id)
    return out


def plan(fleet: Fleet, campaign: Campaign, members: Sequence[Member], now_ms: int,
         min_left: int = DEFAULT_MIN, most: int | None = None) -> Plan:
    """What one round does: every cede nobody adopted is adopted (on the node its id names,
    else the idlest other node); then each node with nothing left that may take work takes a
    share of the slow nodes' to-do, each idle node helping the slow node that would finish
    last, its share of that node's remaining in proportion to its rate. A node that does not
    answer is left out: a move between two others is safe, but a cede it may have adopted is
    not adopted elsewhere (a cede of a move waits for the node its id names)."""
    out = Plan()
    r = roll_up(fleet, campaign, list(members))
    if r.role != "generate":
        out.notes.append(f"campaign {campaign.name} trains: nothing to rebalance")
        return out
    by_node = {m.node: m for m in members}
    silent: list[str] = []
    for name in campaign.nodes:
        m = by_node.get(name)
        load = load_of(m) if m is not None else None
        if load is None:
            silent.append(name)
        else:
            out.loads[name] = load
    gone = reassigned(members, silent)
    for name in gone:
        out.notes.append(f"{name} did not answer and its shard was reassigned (adopt "
                         f"{gone[name]}): it is left out")
    silent = [x for x in silent if x not in gone]
    out.answered = not silent
    if silent:
        out.notes.append(f"{', '.join(silent)} did not answer (or has no run): left out of "
                         "this round")
    loads = out.loads
    busy: set[str] = set()  # nodes given work this round
    for c in r.unadopted:
        waits = f"cede {c.id} of {c.node} ({c.count:,} indices) waits, unsent: "
        to = target_of(campaign, c.id, c.node)
        if to is not None and to not in loads:
            # Only the node the move was for may adopt it (it may have, unseen).
            out.notes.append(waits + f"{to}, the node it was for, did not answer")
            out.waiting += 1
            continue
        if to is not None and loads[to].leaving:
            # It passed decommission-check: what it says (or said, given back) has no adopt
            # of this cede, and it takes no work. Another node finishes the move.
            to = None
        if to is None:
            if silent:
                # A node that did not answer may hold its adopt: elsewhere it could be sent
                # twice.
                out.notes.append(waits + f"{', '.join(silent)} did not answer and may have "
                                 "adopted it")
                out.waiting += 1
                continue
            open_ = [x for x in loads.values() if x.status in TAKES and not x.leaving]
            takers = [x for x in open_ if x.node != c.node] or open_
            if not takers:
                out.notes.append(waits + "no node is running or done to adopt it")
                out.waiting += 1
                continue
            to = min(takers, key=lambda x: (x.left, -(x.rate or 0.0), x.node)).node
        out.readopts.append(Readopt(c.id, c.node, c.count, to))
        busy.add(to)
    for x in loads.values():
        if x.left > 0 and x.status not in LIVE:
            out.notes.append(f"{x.node} owns {x.left:,} indices not done and is {x.status}: "
                             f"nobody sends them until it runs again (fleetdeck resume "
                             f"{x.node})")
    idle = [x for x in loads.values()
            if x.left == 0 and x.status in TAKES and x.node not in busy and not x.leaving]
    slow = [x for x in loads.values()
            if x.status in GIVES and x.left > min_left and not x.warming]
    if not idle or not slow:
        return out
    known = [x.rate for x in idle + slow if x.rate is not None]
    guess = sum(known) / len(known) if known else 1.0  # all unknown: equal shares (half)

    def rate(x: Load) -> float:
        return x.rate if x.rate is not None else guess

    helpers: dict[str, list[Load]] = {s.node: [] for s in slow}
    for i in sorted(idle, key=lambda x: (-rate(x), x.node)):
        # The slow node that would finish last with the help it has so far gets this one.
        s = max(slow, key=lambda s: (s.left / (rate(s) + sum(rate(h) for h in helpers[s.node])),
                                     s.node))
        helpers[s.node].append(i)
    for s in slow:
        team = helpers[s.node]
        if not team:
            continue
        pace = rate(s) + sum(rate(h) for h in team)
        for h in team:
            count = int(s.left * rate(h) / pace)
            if most is not None:
                count = min(count, most)
            if count >= 1:
                out.moves.append(Move(move_id(campaign, s.node, h.node, now_ms), s.node,
                                      h.node, count))
    return out


# -- doing it -----------------------------------------------------------------------------------

@dataclass(slots=True)
class Outcome:
    moved: int = 0  # indices adopted this round (moves and finished cedes)
    steps: int = 0  # cedes and adopts that answered
    refused: list[str] = field(default_factory=list)  # a node said no: nothing happened there
    unknown: list[str] = field(default_factory=list)  # no answer: the step may have happened

    @property
    def ok(self) -> bool:
        return not self.refused and not self.unknown


class StepFailed(Exception):
    def __init__(self, message: str, unknown: bool) -> None:
        super().__init__(message)
        self.unknown = unknown


def _adopt_params(id_: str, ranges: Any, node: str, shard: str | None) -> dict[str, Any]:
    return {"id": id_, "ranges": ranges, "node": node if _NODE_NAME.match(node) else None,
            "shard": shard}


async def _step(call: Call, node: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    try:
        result = await call(node, method, params)
    except RpcError as exc:
        if exc.code == NO_ANSWER:  # its supervisor died holding it: done or not, unknown
            raise StepFailed(f"{node}: {method} {params['id']}: no answer ({exc.message})",
                             True) from None
        raise StepFailed(f"{node} refused {method} {params['id']}: {exc.message}", False) \
            from None
    except (ConnectionError, TimeoutError, OSError) as exc:
        raise StepFailed(f"{node}: {method} {params['id']}: no answer "
                         f"({exc or type(exc).__name__}): it may have been done", True) \
            from None
    if not isinstance(result, dict) or result.get("id") != params["id"] or \
            not isinstance(result.get("ranges"), list):
        raise StepFailed(f"{node}: {method} {params['id']}: an answer that is not its "
                         f"record: {str(result)[:200]}", False)
    return result


async def carry_out(p: Plan, call: Call, say_done: Say, say_why: Say) -> Outcome:
    """The plan's steps, one call each: unadopted cedes first, then the moves. A step that
    fails stops its own move only; what it leaves (a cede nobody adopted) the next round
    finishes under the same id."""
    out = Outcome()

    def failed(exc: StepFailed, after: str = "") -> None:
        (out.unknown if exc.unknown else out.refused).append(str(exc))
        say_why(str(exc) + after)

    for a in p.readopts:
        try:
            rec = await _step(call, a.ceder, "cede", {"id": a.id, "count": max(1, a.count)})
            out.steps += 1
            shard = p.loads[a.ceder].shard if a.ceder in p.loads else None
            got = await _step(call, a.to, "adopt",
                              _adopt_params(a.id, rec["ranges"], a.ceder, shard))
            out.steps += 1
        except StepFailed as exc:
            failed(exc, f"; cede {a.id} stays unadopted until rebalance runs again")
            continue
        count = int(got.get("count", 0))
        out.moved += count
        say_done(f"adopted cede {a.id}: {count:,} indices from {a.ceder} now on {a.to}")
    for m in p.moves:
        try:
            rec = await _step(call, m.slow, "cede", {"id": m.id, "count": m.count})
            out.steps += 1
        except StepFailed as exc:
            failed(exc, f"; if {m.slow} journaled it, rebalance adopts cede {m.id} next time"
                   if exc.unknown else "")
            continue
        crash_point("between_cede_and_adopt")
        try:
            got = await _step(call, m.idle, "adopt", _adopt_params(
                m.id, rec["ranges"], m.slow, p.loads[m.slow].shard))
            out.steps += 1
        except StepFailed as exc:
            failed(exc, f"; {m.slow} ceded {int(rec.get('count', 0)):,} indices (cede {m.id}) "
                   "that wait, unsent, until rebalance runs again")
            continue
        count = int(got.get("count", 0))
        out.moved += count
        say_done(f"moved {count:,} indices {m.slow} -> {m.idle} (cede {m.id}, "
                 f"{len(rec['ranges'])} ranges)")
    return out


def all_done(p: Plan) -> bool:
    """Every node done with nothing left, and no cede waiting for an adopter."""
    return p.answered and not p.readopts and not p.waiting and all(
        x.status == "done" and x.left == 0 for x in p.loads.values())


def anything_live(p: Plan) -> bool:
    return any(x.status in LIVE for x in p.loads.values())


# -- the headless verb --------------------------------------------------------------------------

def add(sub: Any) -> None:
    p = sub.add_parser("rebalance", help="move part of a slow shard's to-do to a node of the "
                       "campaign that is done (dangerous: --yes)")
    p.add_argument("campaign", metavar="CAMPAIGN")
    p.add_argument("--yes", action="store_true", help="confirm: indices move between nodes")
    p.add_argument("--min", type=int, default=DEFAULT_MIN, dest="min_left", metavar="N",
                   help=f"move from a node only when it has more than N to do "
                        f"(default {DEFAULT_MIN})")
    p.add_argument("--max", type=int, default=None, dest="most", metavar="N",
                   help="at most N indices in one move")
    p.add_argument("--auto", action="store_true",
                   help="keep rebalancing until every node of the campaign is done")
    p.add_argument("--interval", type=float, default=5.0, help="--auto: seconds between rounds")
    p.set_defaults(runner=cmd_rebalance)


class Links:
    """One link per node, opened when first needed and again after it was lost."""

    def __init__(self, fleet: Fleet, accept_new: bool, timeout: float) -> None:
        self.fleet = fleet
        self.accept_new = accept_new
        self.timeout = timeout
        self.links: dict[str, AgentLink] = {}

    async def link(self, name: str) -> AgentLink:
        link = self.links.get(name)
        if link is None:
            link = await open_link(self.fleet.node(name), self.accept_new)
            self.links[name] = link
        return link

    async def call(self, name: str, method: str, params: dict[str, Any]) -> Any:
        try:
            link = await self.link(name)
        except Unreachable as exc:  # a host key problem too
            raise ConnectionError(str(exc)) from None
        try:
            return await link.call(method, params, timeout=self.timeout)
        except (ConnectionError, TimeoutError, OSError):
            await self.drop(name)
            raise

    async def drop(self, name: str) -> None:
        link = self.links.pop(name, None)
        if link is not None:
            await link.close()

    async def members(self, names: list[str]) -> list[Member]:
        async def one(name: str) -> Member:
            try:
                raw = await self.call(name, "status", {})
            except RpcError as exc:
                return Member(name, "error", None, exc.message)
            except (ConnectionError, TimeoutError, OSError) as exc:
                return Member(name, "unreachable", None, str(exc) or type(exc).__name__)
            try:
                return Member(name, "connected", msgspec.convert(raw, Snapshot))
            except msgspec.ValidationError as exc:
                return Member(name, "connected", None, f"unreadable snapshot: {exc}")

        return with_given_back(self.fleet, list(await asyncio.gather(*(one(n) for n in names))))

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links.values()),
                             return_exceptions=True)
        self.links.clear()


def _print(line: str) -> None:
    print(shown(line), flush=True)


def _warn(line: str) -> None:
    print(shown(line), file=sys.stderr, flush=True)


async def cmd_rebalance(fleet: Fleet, args: argparse.Namespace) -> int:
    campaign = fleet.campaign(args.campaign)
    if fleet.console.read_only or args.read_only:
        _warn("fleetdeck rebalance: not allowed in read-only mode")
        return EXIT_USAGE
    if not args.yes:
        _warn(f"fleetdeck rebalance: moves indices between the nodes of campaign "
              f"{campaign.name} ({', '.join(campaign.nodes)}): a dangerous action; add --yes")
        return EXIT_USAGE
    if fleet.campaign_role(campaign) != "generate":
        _warn(f"fleetdeck rebalance: campaign {campaign.name} trains; only a generation "
              "campaign's indices move")
        return EXIT_USAGE
    if args.min_left < 0 or (args.most is not None and args.most < 1):
        _warn("fleetdeck rebalance: --min must be >= 0 and --max >= 1")
        return EXIT_USAGE
    links = Links(fleet, args.accept_new_host_key, max(args.timeout, CALL_TIMEOUT_S))
    said: set[str] = set()

    def note(line: str) -> None:
        if not args.auto or line not in said:  # --auto: each note once, not every round
            said.add(line)
            _warn(line)

    try:
        while True:
            members = await links.members(campaign.nodes)
            p = plan(fleet, campaign, members, int(time.time() * 1000), args.min_left,
                     args.most)
            for line in p.notes:
                note(line)
            out = await carry_out(p, links.call, _print, _warn)
            if not args.auto:
                if not out.ok:
                    return EXIT_UNREACHABLE if out.unknown and not out.refused else EXIT_CHECK
                if p.empty:
                    _print(f"campaign {campaign.name}: nothing to move")
                return EXIT_OK if p.answered else EXIT_UNREACHABLE
            if p.empty and all_done(p):
                _print(f"campaign {campaign.name}: every node is done")
                return EXIT_OK
            if p.empty and not anything_live(p):
                _warn(f"campaign {campaign.name}: no node that answers is running, and not "
                      "every node is known to be done: rebalance --auto stops")
                return EXIT_CHECK
            await asyncio.sleep(args.interval if p.empty or not out.ok else 0.5)
    finally:
        await links.close()


# -- the TUI's `rebalance = "auto"` --------------------------------------------------------------

class AutoRebalance:
    """A campaign's `rebalance = "auto"` in the TUI: a round on its refresh from the snapshots
    it holds, when the last round is over; after a round that did anything, only once every
    node that is connected has sent a snapshot since (figures from before a move would plan it
    again). A node whose link is down is silent, however recent its last snapshot."""

    def __init__(self, fleet: Fleet, campaign: Campaign, call: Call, say_done: Say,
                 say_why: Say, clock: Callable[[], float] = time.time,
                 min_left: int = DEFAULT_MIN, interval_s: float = 5.0) -> None:
        self.fleet = fleet
        self.campaign = campaign
        self.call = call
        self.say_done = say_done
        self.say_why = say_why
        self.clock = clock  # the clock that stamps FleetState's received_at
        self.min_left = min_left
        self.interval_s = interval_s
        self.busy = False
        self.last_round = float("-inf")
        self.acted_at = float("-inf")
        self._said: set[str] = set()

    def due(self, state: FleetState) -> bool:
        if self.busy or self.clock() - self.last_round < self.interval_s:
            return False
        for name in self.campaign.nodes:
            ns = state.nodes.get(name)
            if ns is None or ns.link != "connected":
                continue  # silent: the plan leaves it out
            if ns.received_at is None or ns.received_at <= self.acted_at:
                return False
        return True

    def members(self, state: FleetState) -> list[Member]:
        out = []
        for name in self.campaign.nodes:
            ns = state.nodes[name]
            live = ns.link == "connected"
            out.append(Member(name, ns.link, ns.snapshot if live else None, ns.error))
        return with_given_back(self.fleet, out)

    async def round(self, state: FleetState) -> Outcome:
        """One round from what `state` holds now (call it when `due`)."""
        self.busy = True
        self.last_round = self.clock()
        try:
            p = plan(self.fleet, self.campaign, self.members(state),
                     int(time.time() * 1000), self.min_left)
            for line in p.notes:
                if line not in self._said:  # each note once, not every round
                    self._said.add(line)
                    self.say_why(line)
            out = await carry_out(p, self.call, self.say_done, self.say_why)
            if out.steps:
                self.acted_at = self.clock()
            return out
        finally:
            self.busy = False


__all__ = ["CRASH_ENV", "CRASH_POINTS", "AutoRebalance", "Load", "Move", "Outcome", "Plan",
           "Readopt", "add", "all_done", "carry_out", "cmd_rebalance", "crash_point",
           "load_of", "move_id", "plan", "target_of"]
