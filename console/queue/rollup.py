"""A campaign's one view: its nodes' snapshots rolled up into the queue's chunks committed of
all, lines done, rate, the ETA of what is left at the nodes' summed rate, failures,
truncation and alerts, plus what needs a person's eye (a node of another campaign). Pure:
the headless `status CAMPAIGN` and the TUI's campaign row both draw from `roll_up`. Nodes
given back are named by the queue's own records (`queue_status` of any node).

Lines done, failed and truncated are the commits': each node counts the campaign from the
commit objects it has read (agents/queue/tally.py), so the roll-up takes the count of the
node that has read the most of them (commits only grow), and each node's row is its part
of it (the indices whose commit is its own), never the lines it wrote: a backup that lost, a
zombie or a chunk another node committed first wrote lines that count nowhere, and a retry's
line replaces the earlier one whoever wrote that. Only nodes whose agent counts no commits
(older ones) are summed from their own figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from agents.rundir.schema import Alert, QueueProgress, Snapshot
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


GIVEN_BACK = "given back"


class NodeLine(msgspec.Struct, omit_defaults=False):
    """One node's line of the roll-up, from its own snapshot (None: not known)."""

    node: str
    place: str  # a generation campaign: the node's name in the queue; training: rank R/N
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
    held: list[str] = msgspec.field(default_factory=list)  # chunks it works on
    committed_here: int | None = None
    lost: int | None = None  # its commits refused: another node was first
    lost_lines: int | None = None  # lines it wrote that no commit names
    error: str | None = None


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
    slowest: str | None  # a training campaign: rank 0, whose ETA is the job's
    alerts: list[NodeAlert]
    critical: int
    warnings: list[str]
    rows: list[NodeLine]
    chunks: int | None = None  # the queue's, as the freshest node listing saw them
    committed: int | None = None
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


def roll_up(fleet: Fleet, campaign: Campaign, members: list[Member],
            given_back: frozenset[str] = frozenset()) -> Rollup:
    """`given_back`: the nodes whose given-back record is in the queue's prefix; one that does
    not answer counts as given back, not as lost."""
    by_node = {m.node: m for m in members}
    role = fleet.campaign_role(campaign)
    rows: list[NodeLine] = []
    alerts: list[NodeAlert] = []
    warnings: list[str] = []
    statuses: dict[str, int] = {}
    completed = total = failed = truncated = answered = 0
    rate = 0.0
    chunks = committed = None
    chunk_size = lines = 0
    # The campaign's figures from the commits, as the node that has read most of them has
    # them: (commits read, its snapshot's time) -> (done, failed, truncated).
    counted: tuple[tuple[int, float], tuple[int, int, int]] | None = None
    for name in campaign.nodes:
        m = by_node.get(name, Member(name, "unknown"))
        link = GIVEN_BACK if name in given_back and m.link != "connected" else m.link
        place = f"{campaign.position(name)}/{len(campaign.nodes)}" if role == "train" else name
        row = NodeLine(name, place, link, error=m.error)
        rows.append(row)
        snap = m.snapshot
        if snap is None:
            continue
        answered += 1
        row.status = snap.status
        statuses[snap.status] = statuses.get(snap.status, 0) + 1
        row.alerts = len(snap.alerts)
        alerts += [NodeAlert(name, a) for a in snap.alerts]
        p = snap.progress
        if p is None:
            continue
        row.completed, row.total, row.failed = p.completed, p.total, p.failed
        row.truncated, row.rate_per_sec = p.truncated, p.rate_per_sec
        row.eta_hours, row.eta_p10_hours, row.eta_p90_hours = \
            p.eta_hours, p.eta_p10_hours, p.eta_p90_hours
        q = p.queue
        part = commits_part(q) if q is not None else None
        if q is not None and part is not None:
            # Its part of the campaign: of the lines, the share its own commits hold.
            row.completed, row.failed, row.truncated = part
            row.total = q.prompts_lines
            row.lost_lines = q.lost_lines
            whole = (q.lines_done or 0, q.lines_failed or 0, q.lines_truncated or 0)
            seen = (q.commits_counted or 0, p.updated_at)
            if counted is None or seen > counted[0]:
                counted = (seen, whole)
        else:
            completed += p.completed
            total += p.total
            failed += p.failed
            truncated += p.truncated
        if p.status in LIVE:
            rate += p.rate_per_sec
        if p.campaign is not None and p.campaign != campaign.name:
            warnings.append(f"{name} runs for campaign {p.campaign!r}, not {campaign.name!r}")
        if q is not None:
            row.held, row.committed_here, row.lost = list(q.held), q.committed_here, q.lost
            if q.node != name:
                warnings.append(f"{name} takes work as queue node {q.node!r}")
            # Commits only grow: the node that listed most recently saw the most.
            if committed is None or q.committed > committed:
                chunks, committed = q.chunks, q.committed
            lines, chunk_size = max(lines, q.prompts_lines), max(chunk_size, q.chunk_size)
            if q.s3_error:
                warnings.append(f"{name} cannot reach the queue: {q.s3_error}")
    if counted is not None:
        # Every node's commits are in the count: what older agents' nodes wrote is too.
        completed, failed, truncated = counted[1]
    eta = p10 = p90 = None
    slowest = None
    if chunks is not None and committed is not None:
        # The queue's own measure: what is left is the uncommitted chunks' indices.
        total = lines
        left = min(lines, (chunks - committed) * chunk_size)
        eta = 0.0 if left == 0 else (left / rate / 3600 if rate > 0 else None)
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
        warnings=warnings, rows=rows, step=step, total_steps=total_steps, loss=loss,
        chunks=chunks, committed=committed)



def commits_part(q: QueueProgress) -> tuple[int, int, int] | None:
    """A node's part of the campaign (done, failed, truncated: the indices whose commit is
    its own); None when its agent counts no commits."""
    if q.commits_counted is None or q.done_here is None or q.failed_here is None or \
            q.truncated_here is None:
        return None
    return q.done_here, q.failed_here, q.truncated_here


def from_state(state: FleetState, campaign: Campaign) -> Rollup:
    """The roll-up of what the TUI holds now (last snapshots, however old; their links; the
    given-back records its last look at the queue found)."""
    return roll_up(state.fleet, campaign, [
        Member(name, ns.link, ns.snapshot, ns.error) for name in campaign.nodes
        if (ns := state.nodes.get(name)) is not None],
        frozenset(state.given_back.get(campaign.name, ())))


def human(r: Rollup) -> list[str]:
    """`status CAMPAIGN` in words: the roll-up line, its warnings and alerts, then a line per
    node."""
    head = f"campaign {r.campaign}: {r.role} {r.status}"
    if r.statuses and len(r.statuses) > 1:
        head += " (" + ", ".join(f"{n} {s}" for s, n in sorted(r.statuses.items())) + ")"
    if r.role == "train":
        if r.step is not None:
            head += f"  step {r.step}/{r.total_steps} loss {r.loss}"
    else:
        pct = f" ({100 * (r.committed or 0) / r.chunks:.1f}%)" if r.chunks else ""
        if r.chunks is not None:
            head += f"  {r.committed}/{r.chunks} chunks committed{pct};"
        head += (f"  {r.completed:,} lines done, {r.failed:,} failed, "
                 f"{r.truncated:,} truncated, {r.rate_per_sec:.2f}/s")
    head += f", ETA {eta_text(r)}"
    if not r.complete:
        head += f"  [{r.answered} of {r.nodes} nodes answered: totals are partial]"
    lines = [head]
    lines += [f"  WARNING: {w}" for w in r.warnings]
    lines += [f"  ALERT {a.node} {a.alert.severity}: {a.alert.message}" for a in r.alerts]
    for s in r.rows:
        line = f"  {s.node}" + (f" [{s.place}]" if s.place != s.node else "") + f" {s.link}"
        if s.status is not None:
            line += f" {s.status}"
        if s.total is not None:
            line += (f"  {s.completed:,} done, {s.failed:,} failed, "
                     f"{s.rate_per_sec or 0:.2f}/s")
        if s.committed_here is not None:
            line += f", {s.committed_here} chunks committed"
            if s.held:
                line += f", holds {', '.join(s.held)}"
            if s.lost:
                line += f", {s.lost} commits refused"
            if s.lost_lines:
                line += f", {s.lost_lines:,} lines in no commit"
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
