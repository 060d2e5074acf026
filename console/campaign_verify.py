"""A campaign's verified union and the replacement of a dead node, as headless verbs:
`verify CAMPAIGN` (every node's own verify, then the union judged from S3 by the first node
that answers) and `reassign CAMPAIGN NODE --to OTHER --yes` (OTHER's agent writes the reassign
record to S3, then adopts the dead node's not-done indices). Exit codes as headless: 0 all
pass, 1 a check failed or a node refused, 2 usage, 3 a node unreachable."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from agents.rpc.protocol import RpcError
from agents.rundir.shard import parse_shard
from console.fleet import Campaign, Fleet, Node
from console.given_back import judged, when
from console.headless import (
    EXIT_CHECK,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    cmd_verb,
    open_link,
    say,
)
from console.sanitize import shown
from console.transport import AgentLink, Unreachable

LIVE = ("starting", "running", "paused", "draining")
VERIFY_TIMEOUT_S = 3600.0  # every batch of the campaign is read once


@dataclass(slots=True)
class NodeVerify:
    node: str
    shard: str
    report: dict[str, Any] | None = None
    refused: str | None = None
    unreachable: str | None = None
    reassigned: str | None = None  # why this node's own verify does not count
    given_back: str | None = None  # gone after a passing decommission-check: the union judges

    @property
    def ok(self) -> bool:
        return self.report is not None and bool(self.report.get("ok"))

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "shard": self.shard, "ok": self.ok, "report": self.report,
                "refused": self.refused, "unreachable": self.unreachable,
                "counted": self.counted, "reassigned": self.reassigned,
                "given_back": self.given_back}

    @property
    def counted(self) -> bool:
        return self.reassigned is None and self.given_back is None


@dataclass(slots=True)
class CampaignVerify:
    campaign: str
    nodes: list[NodeVerify]
    union: dict[str, Any] | None = None
    union_node: str | None = None
    union_error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        counted = [n for n in self.nodes if n.counted]
        return (self.union_error is not None and self.union_node is not None) or \
            (self.union is not None and not self.union.get("ok")) or \
            any((n.report is not None and not n.ok) or n.refused for n in counted)

    @property
    def unreachable(self) -> list[str]:
        return [n.node for n in self.nodes if n.unreachable and n.counted]

    def exit_code(self) -> int:
        if self.failed:
            return EXIT_CHECK
        if self.unreachable or self.union is None:
            return EXIT_UNREACHABLE
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"campaign": self.campaign, "ok": self.exit_code() == EXIT_OK,
                "nodes": [n.to_json() for n in self.nodes], "union": self.union,
                "union_node": self.union_node, "union_error": self.union_error,
                "unreachable": self.unreachable, "notes": self.notes}


async def _open(node: Node, accept_new: bool) -> AgentLink | str:
    try:
        return await open_link(node, accept_new)
    except (Unreachable, OSError) as exc:
        return str(exc) or type(exc).__name__


async def verify_campaign(fleet: Fleet, campaign: Campaign, accept_new: bool,
                          timeout: float = VERIFY_TIMEOUT_S) -> CampaignVerify:
    """Every node's `verify` and the union's `verify_union`, at once; the union from the first
    node (in the campaign's order) that answers it."""
    nodes = [fleet.node(n) for n in campaign.nodes]
    opened = await asyncio.gather(*(_open(n, accept_new) for n in nodes))
    links = {n.name: x for n, x in zip(nodes, opened, strict=True) if isinstance(x, AgentLink)}
    result = CampaignVerify(campaign.name, [
        NodeVerify(n.name, campaign.shard(n.name),
                   unreachable=x if isinstance(x, str) else None)
        for n, x in zip(nodes, opened, strict=True)])
    by_node = {v.node: v for v in result.nodes}

    async def node_verify(name: str, link: AgentLink) -> None:
        try:
            report = await link.call("verify", {}, timeout=timeout)
            by_node[name].report = report if isinstance(report, dict) else {"ok": False}
        except RpcError as exc:
            by_node[name].refused = exc.message
        except (ConnectionError, TimeoutError, OSError) as exc:
            by_node[name].unreachable = str(exc) or type(exc).__name__

    async def union() -> None:
        params = {"shards": len(campaign.nodes), "nodes": list(campaign.nodes)}
        for name, link in links.items():
            try:
                report = await link.call("verify_union", params, timeout=timeout)
            except RpcError as exc:
                result.union_node, result.union_error = name, exc.message
                return
            except (ConnectionError, TimeoutError, OSError) as exc:
                result.notes.append(f"{name}: verify_union: {exc or type(exc).__name__}; "
                                    "asking the next node")
                continue
            result.union_node = name
            result.union = report if isinstance(report, dict) else None
            return

    try:
        await asyncio.gather(union(), *(node_verify(n, link) for n, link in links.items()))
    finally:
        await asyncio.gather(*(link.close() for link in links.values()),
                             return_exceptions=True)
    for rec in (result.union or {}).get("reassigns") or []:
        for v in result.nodes:
            if isinstance(rec, dict) and rec.get("shard") == v.shard:
                v.reassigned = (f"its shard {v.shard} was reassigned to {rec.get('to')} "
                                f"(record {rec.get('id')}): its own verify does not count; "
                                "its batches in S3 count in the union")
    for v in result.nodes:
        gone = judged(fleet.pull_dir, v.node, "unreachable", None) \
            if v.unreachable is not None else None
        if gone is not None and v.reassigned is None:
            v.given_back = (f"given back after a passing decommission-check at {when(gone)}: "
                            "its shard is judged by the union in S3")
    return result


def human(r: CampaignVerify) -> list[str]:
    lines = []
    for v in r.nodes:
        head = f"{v.node} ({v.shard}): verify"
        if v.unreachable is not None:
            lines.append(f"{head} UNREACHABLE: {v.unreachable}")
        elif v.refused is not None:
            lines.append(f"{head} REFUSED: {v.refused}")
        elif v.ok:
            lines.append(f"{head} ok")
        else:
            lines.append(f"{head} FAIL")
            for p in (v.report or {}).get("problems") or []:
                lines.append(f"    - {p}")
        for why in (v.reassigned, v.given_back):
            if why is not None:
                lines.append(f"    (not counted: {why})")
    if r.union is not None:
        lines.append(f"union of {r.campaign} from {r.union.get('s3_url')} "
                     f"(judged on {r.union_node}): {'ok' if r.union.get('ok') else 'FAIL'}")
        for c in r.union.get("checks") or []:
            lines.append(f"  {'ok  ' if c.get('ok') else 'FAIL'}  {c.get('name')}: "
                         f"{c.get('detail')}")
        for s in r.union.get("shards") or []:
            moved = f", reassigned to {s['reassigned_to']}" if s.get("reassigned_to") else ""
            lines.append(f"  shard {s.get('shard')} ({s.get('node') or '?'}): "
                         f"{s.get('done')} done, {s.get('failed')} failed of {s.get('owned')} "
                         f"owned, {s.get('batches')} batches{moved}")
        for u in r.union.get("unadopted") or []:
            lines.append(f"  UNADOPTED {u.get('id')} from shard {u.get('shard')} "
                         f"({u.get('node') or '?'}): {u.get('count')} indices: "
                         f"{u.get('ranges')}")
    elif r.union_error is not None:
        lines.append(f"union of {r.campaign}: {r.union_node} refused: {r.union_error}")
    else:
        lines.append(f"union of {r.campaign}: not judged: no node of the campaign answered")
    lines += r.notes
    return lines


async def cmd_verify(fleet: Fleet, args: argparse.Namespace) -> int:
    """`verify NAME`: a node's own verify, or a campaign's (every node's, then the union)."""
    if not fleet.has_campaign(args.node_name):
        return await cmd_verb(fleet, args)
    campaign = fleet.campaign(args.node_name)
    if fleet.campaign_role(campaign) != "generate":
        say(f"fleetdeck verify: {campaign.name} is a training campaign; verify is for "
            "generation")
        return EXIT_USAGE
    r = await verify_campaign(fleet, campaign, args.accept_new_host_key)
    if args.json:
        print(json.dumps(r.to_json()), flush=True)
    else:
        for line in human(r):
            print(shown(line), flush=True)
    code = r.exit_code()
    if r.unreachable:
        judged = (f"the union was judged from S3 regardless, on {r.union_node}"
                  if r.union is not None else "no node answered: the union was not judged")
        say(f"campaign {campaign.name}: {', '.join(r.unreachable)} did not answer: "
            f"{judged}")
    if code == EXIT_CHECK:
        say(f"campaign {campaign.name}: verify FAILED")
    return code


# -- reassign -----------------------------------------------------------------------------------

async def cmd_reassign(fleet: Fleet, args: argparse.Namespace) -> int:
    """A node dead for good: OTHER takes over its shard's not-done indices (judged from S3)."""
    campaign = fleet.campaign(args.campaign)
    dead, other = args.node_name, args.to
    if fleet.console.read_only or args.read_only:
        say("fleetdeck reassign: not allowed in read-only mode")
        return EXIT_USAGE
    problem = None
    if dead not in campaign.nodes:
        problem = f"{dead} is not a node of campaign {campaign.name} " \
                  f"({', '.join(campaign.nodes)})"
    elif other not in campaign.nodes:
        problem = f"--to {other} is not a node of campaign {campaign.name} " \
                  f"({', '.join(campaign.nodes)}): the shard goes to another of its nodes"
    elif other == dead:
        problem = f"--to {other} is the node being replaced: name another node of the campaign"
    elif fleet.campaign_role(campaign) != "generate":
        problem = f"{campaign.name} is a training campaign: reassign moves generation indices"
    if problem is not None:
        say(f"fleetdeck reassign: {problem}")
        return EXIT_USAGE
    if not args.yes:
        say(f"fleetdeck reassign: a dangerous action: {dead}'s shard "
            f"{campaign.shard(dead)} goes to {other} for good, and {dead} may never resume "
            "it; add --yes")
        return EXIT_USAGE
    shard = parse_shard(campaign.shard(dead), f"campaign {campaign.name}")
    living = await _still_running(fleet.node(dead), args.accept_new_host_key)
    if living is not None:
        say(f"fleetdeck reassign: {dead} is reachable and its run is {living}: reassign is for "
            f"a node dead for good. Stop it first (`fleetdeck stop {dead} --yes`), or move "
            f"part of its work with `fleetdeck rebalance {campaign.name}`")
        return EXIT_CHECK
    params = {"id": f"reassign-{shard.tag}", "shard": shard.text, "node": dead, "to": other}
    try:
        link = await open_link(fleet.node(other), args.accept_new_host_key)
    except (Unreachable, OSError) as exc:
        say(f"fleetdeck reassign: {other}: {exc}")
        return EXIT_UNREACHABLE
    try:
        result = await link.call("reassign", params, timeout=max(args.timeout, 600.0))
    except RpcError as exc:
        say(f"{other}: reassign: {shown(exc.message)}")
        return EXIT_CHECK
    except (ConnectionError, TimeoutError) as exc:
        say(f"{other}: reassign: {shown(exc)}; run the same command again: it finds the "
            "record and finishes")
        return EXIT_UNREACHABLE
    finally:
        await link.close()
    print(json.dumps(result), flush=True)
    rec = result.get("record") or {}
    again = " (the record was already there: finished)" if result.get("existed") else ""
    say(f"campaign {campaign.name}: shard {shard.text} of {dead} reassigned to {other}: "
        f"{rec.get('count')} indices, record {shown(str(result.get('key')))}{again}")
    return EXIT_OK


async def _still_running(node: Node, accept_new: bool) -> str | None:
    """The status word when the node answers and its run is live; None when it is dead (or
    answers but runs nothing)."""
    try:
        link = await open_link(node, accept_new)
    except (Unreachable, OSError):
        return None
    try:
        snap = await link.call("status", {}, timeout=30)
    except (RpcError, ConnectionError, TimeoutError, OSError):
        return None
    finally:
        await link.close()
    status = snap.get("status") if isinstance(snap, dict) else None
    return str(status) if status in LIVE else None


def add(sub: Any) -> None:
    """`reassign`, and `verify` taking a campaign (the node verb registered by headless)."""
    verify = sub.choices.get("verify")
    if verify is not None:
        verify.add_argument("--json", action="store_true",
                            help="one JSON object (a node's verify is JSON already)")
        verify.set_defaults(runner=cmd_verify)
        verify.description = ("a node: check S3 and the counts on it; a CAMPAIGN: every "
                              "node's verify, then the union from S3 (every index owned by "
                              "one shard, done once or failed)")
    p = sub.add_parser("reassign", help="a campaign node dead for good: another node of the "
                       "campaign takes its shard's not-done indices (judged from S3)")
    p.add_argument("campaign", metavar="CAMPAIGN")
    p.add_argument("node_name", metavar="NODE")
    p.add_argument("--to", required=True, metavar="OTHER")
    p.add_argument("--yes", action="store_true", help="confirm a dangerous action")
    p.set_defaults(runner=cmd_reassign)


__all__ = ["CampaignVerify", "NodeVerify", "add", "cmd_reassign", "cmd_verify", "human",
           "verify_campaign"]
