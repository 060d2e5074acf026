"""The headless verbs on a campaign: `launch CAMPAIGN --yes` (a check round on every node, then
every node started; a node already running the campaign is left as it is, so a node added to
the fleet file joins by the same command), `status CAMPAIGN` (one roll-up, with the queue's
own state from one node), `verify CAMPAIGN` (the proof, from the commits), `retry CAMPAIGN
failed|truncated` (a new generation, then every node resumed to run it) and the control verbs
sent to every node, each as that node's own call (so each node audits it). Exit codes as
headless: 0 ok, 1 a node refused or a check failed, 2 usage or input (nothing started), 3 a
node unreachable."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from agents.rpc.protocol import RpcError
from console.actions import BY_ID
from console.fleet import Campaign, Fleet, Node
from console.headless import (
    EXIT_CHECK,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    VERB_PARAMS,
    NodeStatus,
    cmd_status,
    cmd_verb,
    open_link,
    say,
    status_once,
)
from console.queue import rollup
from console.queue.launch import check_problems, launch_params, spec_problem
from console.queue.rollup import GIVEN_BACK
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
    if method == "retry" and fleet.campaign_role(campaign) == "generate":
        return await cmd_campaign_retry(fleet, campaign, args)
    if method == "verify" and fleet.campaign_role(campaign) == "generate":
        return await cmd_campaign_verify(fleet, campaign, args)
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


def for_campaign(fleet: Fleet, args: argparse.Namespace, runner: Any) -> Any:
    """The runner for this command line: a campaign's own when it names a campaign where a
    node goes (status, and the verbs headless registers), else `runner` itself."""
    name = getattr(args, "target", None) if runner is cmd_status else \
        getattr(args, "node_name", None) if runner is cmd_verb else None
    if not name or not fleet.has_campaign(name):
        return runner
    if runner is cmd_status:
        if args.node is not None:
            return runner  # headless refuses a target with --node
        return lambda f, a: cmd_campaign_status(f, f.campaign(name), a)
    return cmd_campaign_verb


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
    only = getattr(args, "only", None) or []
    strays = [n for n in only if n not in campaign.nodes]
    if strays:
        say(f"campaign {campaign.name}: {', '.join(strays)} not one of its nodes "
            f"({', '.join(campaign.nodes)}): add it to the campaign's nodes in the fleet file")
        return EXIT_USAGE
    nodes = [fleet.node(n) for n in (only or campaign.nodes)]
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
    return _report(outcomes, "launch", [n.name for n in nodes])


# -- status -------------------------------------------------------------------------------------

def members(entries: list[NodeStatus]) -> list[rollup.Member]:
    return [rollup.Member(e.node, e.link, e.snapshot, e.error or e.unreadable)
            for e in entries]


async def queue_call(fleet: Fleet, campaign: Campaign, method: str, params: dict[str, Any],
                     accept_new: bool, timeout: float,
                     prefer: list[str] | None = None) -> tuple[str, Any]:
    """One queue call (its answer is the campaign's, whichever node makes it) on the first
    node that answers, the live ones first; RpcError or Unreachable from the last tried."""
    order = [n for n in (prefer or []) if n in campaign.nodes] + \
        [n for n in campaign.nodes if n not in (prefer or [])]
    last: Exception = Unreachable(f"campaign {campaign.name}: no node answered")
    for name in order:
        try:
            link = await open_link(fleet.node(name), accept_new)
        except (Unreachable, OSError) as exc:
            last = Unreachable(f"{name}: {exc}")
            continue
        try:
            return name, await link.call(method, params, timeout=timeout)
        except RpcError as exc:
            if "not a campaign node" in str(exc):
                last = exc
                continue
            raise
        except (ConnectionError, TimeoutError) as exc:
            last = Unreachable(f"{name}: {method}: {exc}")
        finally:
            await link.close()
    raise last


def given_back_of(queue: Any) -> frozenset[str]:
    nodes = queue.get("nodes", {}) if isinstance(queue, dict) else {}
    return frozenset(n for n, v in nodes.items() if isinstance(v, dict) and "given_back" in v)


async def cmd_campaign_status(fleet: Fleet, campaign: Campaign, args: argparse.Namespace
                              ) -> int:
    nodes = [fleet.node(n) for n in campaign.nodes]
    generate = fleet.campaign_role(campaign) == "generate"
    while True:
        entries = await status_once(fleet, nodes, args.accept_new_host_key)
        known = members(entries)
        queue: Any = None
        if generate:
            live = [e.node for e in entries if e.link == "connected"]
            try:
                _, queue = await queue_call(fleet, campaign, "queue_status", {},
                                            args.accept_new_host_key, 60.0, prefer=live)
            except (RpcError, Unreachable) as exc:
                queue = {"error": str(exc)}
        r = rollup.roll_up(fleet, campaign, known, given_back_of(queue))
        if isinstance(queue, dict) and queue.get("error"):
            r.warnings.append(f"the queue's own state is unknown: {queue['error']}")
        if args.json:
            print(json.dumps({"time": time.time(), "campaign": msgspec.to_builtins(r),
                              "queue": queue, "nodes": [e.to_json() for e in entries]}),
                  flush=True)
        else:
            for line in rollup.human(r):
                print(shown(line), flush=True)
        if args.exit_on_alert and r.alerts:
            return EXIT_CHECK
        if not args.watch:
            break
        await asyncio.sleep(args.interval)
    if any(row.link not in ("connected", GIVEN_BACK) for row in r.rows):
        return EXIT_UNREACHABLE
    return EXIT_OK


# -- verify and retry ---------------------------------------------------------------------------

async def _ask_queue(fleet: Fleet, campaign: Campaign, args: argparse.Namespace, method: str,
                     params: dict[str, Any], at_least_s: float, what: str
                     ) -> tuple[str, Any] | int:
    """queue_call for a verb: (node, answer), or the exit code once the refusal (1) or the
    unreachable fleet (3) is said."""
    try:
        return await queue_call(fleet, campaign, method, params, args.accept_new_host_key,
                                max(args.timeout, at_least_s))
    except RpcError as exc:
        say(f"campaign {campaign.name}: {what}: {shown(str(exc))}")
        return EXIT_CHECK
    except Unreachable as exc:
        say(f"campaign {campaign.name}: {what}: {shown(str(exc))}")
        return EXIT_UNREACHABLE


async def cmd_campaign_verify(fleet: Fleet, campaign: Campaign, args: argparse.Namespace
                              ) -> int:
    """The campaign's proof from its commits, made by one node (it HEADs the batches; with
    --deep it also reads a share of their bodies)."""
    deep = float(getattr(args, "deep", 0.0) or 0.0)
    got = await _ask_queue(fleet, campaign, args, "queue_verify", {"deep": deep}, 600.0,
                           "verify")
    if isinstance(got, int):
        return got
    node, report = got
    if getattr(args, "json", False):
        print(json.dumps({"campaign": campaign.name, "by": node, **report}))
    else:
        print(shown(f"campaign {campaign.name} (verified by {node}): {report.get('summary')}"))
        for p in report.get("problems", [])[:50]:
            print(f"  - {shown(str(p))}")
    return EXIT_OK if report.get("ok") else EXIT_CHECK


async def cmd_campaign_retry(fleet: Fleet, campaign: Campaign, args: argparse.Namespace
                             ) -> int:
    """`retry CAMPAIGN failed|truncated`: generation G+1 over the indices the commits mark
    so (at the campaign's max_tokens now, if --max-tokens is given), then every reachable
    node resumed, so nodes that had finished claim its chunks."""
    refusal = dangerous_refusal(fleet, args, f"campaign {campaign.name}") \
        if BY_ID.get("retry") is not None and BY_ID["retry"].dangerous else None
    if refusal is not None:
        say(refusal)
        return EXIT_USAGE
    if getattr(args, "long_only", False):
        # A campaign's generation is built from its commits, which keep no loop bits.
        say(f"fleetdeck retry: --long-only is a node's retry, not campaign {campaign.name}'s "
            "(its new generation comes from the commits, which do not tell loops apart)")
        return EXIT_USAGE
    params: dict[str, Any] = {"what": args.what}
    if getattr(args, "max_tokens", None):
        params["max_tokens"] = args.max_tokens
    got = await _ask_queue(fleet, campaign, args, "queue_retry", params, 120.0,
                           f"retry {args.what}")
    if isinstance(got, int):
        return got
    node, answer = got
    say(f"campaign {campaign.name}: {shown(str(answer.get('summary')))} (made by {node})")
    if answer.get("generation") is None:
        return EXIT_OK
    nodes = [fleet.node(n) for n in campaign.nodes]
    links, unreachable = await _open_all(fleet, nodes, args.accept_new_host_key)
    try:
        outcomes = await _call_all(links, "resume", {n: {} for n in links}, args.timeout)
    finally:
        await _close_all(links)
    return _report(outcomes + unreachable, "resume", campaign.nodes)
