"""The headless verbs on a campaign: `launch CAMPAIGN --yes` (a check round on every node, then
every shard started), `status CAMPAIGN` (one roll-up) and the control verbs sent to every node
of a campaign, each as that node's own call (so each node audits it). Exit codes as headless:
0 ok, 1 a node refused, 2 usage or input (nothing started), 3 a node unreachable."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from agents.rpc.protocol import RpcError
from console import campaign as rollup
from console.actions import BY_ID
from console.campaign_launch import check_problems, launch_params, spec_problem
from console.fleet import Campaign, Fleet, Node
from console.given_back import LINK as GIVEN_BACK
from console.given_back import with_given_back
from console.headless import (
    EXIT_CHECK,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    VERB_PARAMS,
    NodeStatus,
    open_link,
    say,
    status_once,
)
from console.sanitize import shown
from console.transport import AgentLink, Unreachable

# Verbs that take a campaign's name for a node's: each node gets the same call.
FAN_OUT = frozenset({"pause", "unpause", "resize", "max_tokens", "retry", "resume", "stop",
                     "down"})


@dataclass(slots=True)
class Outcome:
    """One node's answer to one call: its result, or why there is none."""

    node: str
    result: Any = None
    refused: str | None = None  # the agent answered with an error
    unreachable: str | None = None

    @property
    def ok(self) -> bool:
        return self.refused is None and self.unreachable is None

    @property
    def why(self) -> str:
        return self.refused or self.unreachable or ""


async def _open_all(fleet: Fleet, nodes: list[Node], accept_new: bool
                    ) -> tuple[dict[str, AgentLink], list[Outcome]]:
    async def one(node: Node) -> AgentLink | Outcome:
        try:
            return await open_link(node, accept_new)
        except (Unreachable, OSError) as exc:
            return Outcome(node.name, unreachable=str(exc))

    opened = await asyncio.gather(*(one(n) for n in nodes))
    links = {n.name: x for n, x in zip(nodes, opened, strict=True) if isinstance(x, AgentLink)}
    return links, [x for x in opened if isinstance(x, Outcome)]


async def _call_all(links: dict[str, AgentLink], method: str,
                    params: dict[str, dict[str, Any]], timeout: float) -> list[Outcome]:
    """The same method on every link at once, each with its own params."""
    async def one(name: str, link: AgentLink) -> Outcome:
        try:
            return Outcome(name, await link.call(method, params[name], timeout=timeout))
        except RpcError as exc:
            return Outcome(name, refused=exc.message)
        except (ConnectionError, TimeoutError, OSError) as exc:
            return Outcome(name, unreachable=str(exc) or type(exc).__name__)

    return list(await asyncio.gather(*(one(n, link) for n, link in links.items())))


async def _close_all(links: dict[str, AgentLink]) -> None:
    await asyncio.gather(*(link.close() for link in links.values()), return_exceptions=True)


def _report(outcomes: list[Outcome], method: str, order: list[str]) -> int:
    """A line per node (results on stdout, refusals on stderr); the exit code of the worst."""
    by_node = {o.node: o for o in outcomes}
    for name in order:
        o = by_node[name]
        if o.ok:
            print(f"{name}: {json.dumps(o.result)}", flush=True)
        else:
            say(f"{name}: {method}: {shown(o.why)}")
    if any(o.refused is not None for o in outcomes):
        return EXIT_CHECK
    if any(o.unreachable is not None for o in outcomes):
        return EXIT_UNREACHABLE
    return EXIT_OK


def dangerous_refusal(fleet: Fleet, args: argparse.Namespace, what: str) -> str | None:
    if fleet.console.read_only or args.read_only:
        return f"fleetdeck {args.command}: not allowed in read-only mode"
    if not args.yes:
        return f"fleetdeck {args.command}: a dangerous action on {what}; add --yes"
    return None


async def cmd_campaign_verb(fleet: Fleet, args: argparse.Namespace) -> int:
    """A control verb on every node of the campaign, each node's own call (and audit line)."""
    campaign = fleet.campaign(args.node_name)
    method = args.method
    if method == "launch":
        return await cmd_launch(fleet, campaign, args)
    if method not in FAN_OUT:
        say(f"fleetdeck {args.command}: {campaign.name} is a campaign; {args.command} takes a "
            f"node (on a campaign: launch, status, "
            f"{', '.join(sorted(m.replace('_', '-') for m in FAN_OUT))})")
        return EXIT_USAGE
    action = BY_ID.get(method)
    if action is not None and action.dangerous:
        refusal = dangerous_refusal(fleet, args, f"every node of campaign {campaign.name} "
                                    f"({', '.join(campaign.nodes)})")
        if refusal is not None:
            say(refusal)
            return EXIT_USAGE
    params = VERB_PARAMS[method](args)
    nodes = [fleet.node(n) for n in campaign.nodes]
    links, unreachable = await _open_all(fleet, nodes, args.accept_new_host_key)
    try:
        outcomes = await _call_all(links, method, {n: params for n in links}, args.timeout)
    finally:
        await _close_all(links)
    return _report(outcomes + unreachable, method, campaign.nodes)


# -- launch -------------------------------------------------------------------------------------

async def cmd_launch(fleet: Fleet, campaign: Campaign, args: argparse.Namespace) -> int:
    refusal = dangerous_refusal(fleet, args, f"every node of campaign {campaign.name} "
                                f"({', '.join(campaign.nodes)})")
    if refusal is not None:
        say(refusal)
        return EXIT_USAGE
    missing = spec_problem(fleet, campaign, args.spec)
    if missing is not None:
        say(missing)
        return EXIT_USAGE
    nodes = [fleet.node(n) for n in campaign.nodes]
    params = {n.name: launch_params(fleet, campaign, n, args.spec) for n in nodes}
    links, unreachable = await _open_all(fleet, nodes, args.accept_new_host_key)
    try:
        checks = await _call_all(links, "launch", {n: {**params[n], "check": True}
                                                   for n in links}, args.timeout)
        failed = [o for o in checks + unreachable if not o.ok]
        if failed:
            for o in sorted(failed, key=lambda o: campaign.nodes.index(o.node)):
                say(f"{o.node}: launch check: {shown(o.why)}")
            say(f"campaign {campaign.name}: not launched: every node must pass the check "
                "first; nothing was started on any node")
            return EXIT_UNREACHABLE if all(o.unreachable for o in failed) else EXIT_USAGE
        answers = {o.node: o.result if isinstance(o.result, dict) else {} for o in checks}
        problems = check_problems(fleet, campaign, answers)
        if problems:
            for p in problems:
                say(f"campaign {campaign.name}: {shown(p)}")
            say(f"campaign {campaign.name}: not launched; nothing was started on any node")
            return EXIT_USAGE
        say(f"campaign {campaign.name}: check passed on {len(nodes)} nodes; launching")
        outcomes = await _call_all(links, "launch", params, max(args.timeout, 180.0))
    finally:
        await _close_all(links)
    return _report(outcomes, "launch", campaign.nodes)


# -- status -------------------------------------------------------------------------------------

def members(entries: list[NodeStatus]) -> list[rollup.Member]:
    return [rollup.Member(e.node, e.link, e.snapshot, e.error or e.unreadable)
            for e in entries]


async def cmd_campaign_status(fleet: Fleet, campaign: Campaign, args: argparse.Namespace
                              ) -> int:
    nodes = [fleet.node(n) for n in campaign.nodes]
    while True:
        entries = await status_once(fleet, nodes, args.accept_new_host_key)
        known = with_given_back(fleet, members(entries))
        r = rollup.roll_up(fleet, campaign, known)
        if args.json:
            print(json.dumps({"time": time.time(), "campaign": msgspec.to_builtins(r),
                              "nodes": [e.to_json() for e in entries]}), flush=True)
        else:
            for line in rollup.human(r):
                print(shown(line), flush=True)
        if args.exit_on_alert and r.alerts:
            return EXIT_CHECK
        if not args.watch:
            break
        await asyncio.sleep(args.interval)
    if any(m.link not in ("connected", GIVEN_BACK) for m in known):
        return EXIT_UNREACHABLE
    return EXIT_OK
