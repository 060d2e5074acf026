"""A campaign's one view: its nodes' snapshots rolled up into done/total across shards, rate,
the slowest shard's ETA (with its band), failures, truncation and alerts, plus what needs a
person's eye (ceded ranges nobody adopted, a node on another shard). Pure: the headless
`status CAMPAIGN` and the TUI's campaign row both draw from `roll_up`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from agents.rundir.schema import Alert, Snapshot
from console.fleet import Campaign, Fleet
from console.state import FleetState

LIVE = ("running", "paused", "draining", "starting")


@dataclass(frozen=True, slots=True)
class Member:
    """What the console knows of one node of a campaign, however it learnt it."""

    node: str
    link: str  # connected, unreachable, reconnecting, error...
    snapshot: Snapshot | None = None
    error: str | None = None
    leaving: bool = False  # passed decommission-check (console/given_back.py): takes no work


class Shard(msgspec.Struct, omit_defaults=False):
    """One node's line of the roll-up, from its own snapshot (None: not known)."""

    node: str
    shard: str  # K/N as the fleet file gives it (a training campaign: the rank R/N)
    link: str
    status: str | None = None
    completed: int | None = None
    total: int | None = None
    failed: int | None = None
    truncated: int | None = None
    rate_per_sec: float | None = None
    eta_hours: float | None = None
    eta_p10_hours: float | None = None
    eta_p90_hours: float | None = None
    alerts: int = 0
    running_shard: str | None = None  # the shard the node's run says it owns
    error: str | None = None


class Cede(msgspec.Struct):
    """A range a node gave up that no node has adopted: its indices are nobody's to send."""

    node: str
    id: str
    count: int


class NodeAlert(msgspec.Struct):
    node: str
    alert: Alert


class Rollup(msgspec.Struct, omit_defaults=False):
    campaign: str
    role: Literal["generate", "train"]
    nodes: int
    answered: int  # nodes whose figures are known (a snapshot, however old)
    status: str  # the one word for the whole: running, paused, done, failed, mixed...
    statuses: dict[str, int]
    completed: int
    total: int
    failed: int
    truncated: int
    rate_per_sec: float
    eta_hours: float | None
    eta_p10_hours: float | None
    eta_p90_hours: float | None
    slowest: str | None  # the node whose ETA is the campaign's
    alerts: list[NodeAlert]
    critical: int
    unadopted: list[Cede]
    warnings: list[str]
    shards: list[Shard]
    # A training campaign: rank 0's figures (the job's), the others show health only.
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None

    @property
    def complete(self) -> bool:
        """Every node's figures are known: totals are the campaign's, not a part of it."""
        return self.answered == self.nodes


def members_status(statuses: dict[str, int]) -> str:
    """One word: all alike -> that; any still working -> running; else failed, then paused;
    a mix of finished states -> mixed."""
    if not statuses:
        return "unknown"
    if len(statuses) == 1:
        return next(iter(statuses))
    if any(s in statuses for s in ("running", "starting", "draining")):
        return "running"
    for s in ("failed", "paused"):
        if s in statuses:
            return s
    return "mixed"


def roll_up(fleet: Fleet, campaign: Campaign, members: list[Member]) -> Rollup:
    by_node = {m.node: m for m in members}
    role = fleet.campaign_role(campaign)
    shards: list[Shard] = []
    alerts: list[NodeAlert] = []
    warnings: list[str] = []
    statuses: dict[str, int] = {}
    completed = total = failed = truncated = answered = 0
    rate = 0.0
    live_etas: list[tuple[str, float | None, float | None, float | None]] = []
    cedes: dict[str, Cede] = {}
    adopted: set[str] = set()
    silent: list[str] = []
    for name in campaign.nodes:
        m = by_node.get(name, Member(name, "unknown"))
        shard = Shard(name, campaign.shard(name), m.link, error=m.error)
        shards.append(shard)
        snap = m.snapshot
        if snap is None:
            silent.append(name)
            continue
        answered += 1
        shard.status = snap.status
        statuses[snap.status] = statuses.get(snap.status, 0) + 1
        shard.alerts = len(snap.alerts)
        alerts += [NodeAlert(name, a) for a in snap.alerts]
        p = snap.progress
        if p is None:
            continue
        shard.completed, shard.total, shard.failed = p.completed, p.total, p.failed
        shard.truncated, shard.rate_per_sec = p.truncated, p.rate_per_sec
        shard.eta_hours, shard.eta_p10_hours, shard.eta_p90_hours = \
            p.eta_hours, p.eta_p10_hours, p.eta_p90_hours
        shard.running_shard = p.shard
        completed += p.completed
        total += p.total
        failed += p.failed
        truncated += p.truncated
        if p.status in LIVE:
            rate += p.rate_per_sec
            live_etas.append((name, p.eta_hours, p.eta_p10_hours, p.eta_p90_hours))
        if p.shard is not None and p.shard != shard.shard:
            warnings.append(f"{name} runs shard {p.shard}; the fleet file gives it "
                            f"{shard.shard}")
        if p.campaign is not None and p.campaign != campaign.name:
            warnings.append(f"{name} runs for campaign {p.campaign!r}, not {campaign.name!r}")
        if p.ownership is not None:
            for move in p.ownership.cedes:
                cedes.setdefault(move.id, Cede(name, move.id, move.count))
            adopted.update(a.id for a in p.ownership.adopts)
    unadopted = [c for cid, c in cedes.items() if cid not in adopted]
    for c in unadopted:
        maybe = (f"; {', '.join(silent)} did not answer and may hold it" if silent else "")
        warnings.append(f"{c.node} ceded {c.count:,} indices (cede {c.id}) that no node has "
                        f"adopted: nobody sends them until one adopts them{maybe}")
    eta, p10, p90, slowest = _slowest(live_etas)
    if role == "train":
        # The job is one torchrun across the nodes: rank 0 speaks for it.
        lead = by_node.get(campaign.nodes[0])
        t = lead.snapshot.train if lead is not None and lead.snapshot is not None else None
        step = total_steps = None
        loss = None
        if t is not None:
            step, total_steps, loss = t.step, t.total_steps, t.loss
            eta, p10, p90, slowest = t.eta_hours, None, None, campaign.nodes[0]
            rate = t.tokens_per_s
    else:
        step = total_steps = None
        loss = None
    return Rollup(
        campaign=campaign.name, role=role, nodes=len(campaign.nodes), answered=answered,
        status=members_status(statuses), statuses=statuses, completed=completed, total=total,
        failed=failed, truncated=truncated, rate_per_sec=rate, eta_hours=eta,
        eta_p10_hours=p10, eta_p90_hours=p90, slowest=slowest, alerts=alerts,
        critical=sum(1 for a in alerts if a.alert.severity == "critical"),
        unadopted=unadopted, warnings=warnings, shards=shards, step=step,
        total_steps=total_steps, loss=loss)


def from_state(state: FleetState, campaign: Campaign) -> Rollup:
    """The roll-up of what the TUI holds now (last snapshots, however old; their links), a
    node given back counted as it was when it passed decommission-check."""
    from console.given_back import with_given_back  # it builds on Member

    return roll_up(state.fleet, campaign, with_given_back(state.fleet, [
        Member(name, ns.link, ns.snapshot, ns.error) for name in campaign.nodes
        if (ns := state.nodes.get(name)) is not None]))


def _slowest(live: list[tuple[str, float | None, float | None, float | None]]
             ) -> tuple[float | None, float | None, float | None, str | None]:
    """The campaign ends when its last shard does: the largest ETA among the live shards (None
    while any live shard's is unknown), with a band when a shard has one: each end is the
    largest of the shards' (a shard without a band counts with its ETA)."""
    if not live:
        return None, None, None, None
    unknown = [name for name, eta, _, _ in live if eta is None]
    if unknown:
        return None, None, None, unknown[0]
    name, eta, _, _ = max(live, key=lambda x: x[1] or 0.0)
    if not any(lo is not None for _, _, lo, _ in live):
        return eta, None, None, name
    p10 = max((lo if lo is not None else e) or 0.0 for _, e, lo, _ in live)
    open_end = any(lo is not None and hi is None for _, _, lo, hi in live)
    p90 = None if open_end else max((hi if hi is not None else e) or 0.0
                                    for _, e, _, hi in live)
    return eta, p10, p90, name


def human(r: Rollup) -> list[str]:
    """`status CAMPAIGN` in words: the roll-up line, its warnings and alerts, then a line per
    shard."""
    head = f"campaign {r.campaign}: {r.role} {r.status}"
    if r.statuses and len(r.statuses) > 1:
        head += " (" + ", ".join(f"{n} {s}" for s, n in sorted(r.statuses.items())) + ")"
    if r.role == "train":
        if r.step is not None:
            head += f"  step {r.step}/{r.total_steps} loss {r.loss}"
    else:
        pct = f" ({100 * r.completed / r.total:.1f}%)" if r.total else ""
        head += (f"  {r.completed:,}/{r.total:,} done{pct}, {r.failed:,} failed, "
                 f"{r.truncated:,} truncated, {r.rate_per_sec:.2f}/s")
    head += f", ETA {eta_text(r)}"
    if not r.complete:
        head += f"  [{r.answered} of {r.nodes} nodes answered: totals are partial]"
    lines = [head]
    lines += [f"  WARNING: {w}" for w in r.warnings]
    lines += [f"  ALERT {a.node} {a.alert.severity}: {a.alert.message}" for a in r.alerts]
    for s in r.shards:
        line = f"  {s.node} [{s.shard}] {s.link}"
        if s.status is not None:
            line += f" {s.status}"
        if s.total is not None:
            eta = "?" if s.eta_hours is None else f"{s.eta_hours:.2f} h"
            line += (f"  {s.completed:,}/{s.total:,} done, {s.failed:,} failed, "
                     f"{s.rate_per_sec or 0:.2f}/s, ETA {eta}")
        if s.alerts:
            line += f", {s.alerts} alert{'s' if s.alerts > 1 else ''}"
        if s.error:
            line += f" - {s.error}"
        lines.append(line)
    return lines


def eta_text(r: Rollup) -> str:
    if r.eta_hours is None:
        return "?" if r.status != "done" else "done"
    text = f"{r.eta_hours:.2f} h"
    if r.eta_p10_hours is not None and r.eta_hours:
        hi = "?" if r.eta_p90_hours is None else f"{r.eta_p90_hours:.2f}"
        text += f" (p10-p90 {r.eta_p10_hours:.2f}-{hi} h)"
    if r.slowest is not None:
        text += f" ({r.slowest})"
    return text
