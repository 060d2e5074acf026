"""The console's headless verbs: the same transport and RPC as the TUI, data on stdout,
narration and errors on stderr. Exit codes: 0 ok, 1 a check failed or an alert fired where
asked, 2 usage or input error, 3 a node unreachable. Never imports Textual."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from agents.rpc.protocol import INVALID_PARAMS, RpcError
from agents.rundir.gpugroups import label as gpu_label
from agents.rundir.schema import ServerStatus, Snapshot
from console.actions import BY_ID
from console.fleet import Fleet, FleetError, Node, load_fleet
from console.linkstate import LinkState
from console.sanitize import shown
from console.transport import AgentLink, HostKeyProblem, Unreachable, accept_host_key

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
DASH = "–"  # a figure the server does not give: unknown, never 0


def say(msg: str) -> None:
    print(msg, file=sys.stderr)


async def open_link(node: Node, accept_new: bool) -> AgentLink:
    link = AgentLink(node)
    try:
        await link.connect()
    except HostKeyProblem as exc:
        if exc.kind == "unknown" and accept_new:
            fp = await accept_host_key(node, exc)  # the very key whose fingerprint was shown
            say(f"{node.name}: accepted new host key {fp}")
            await link.connect()
        else:
            raise
    return link


StatusLink = LinkState | Literal["error"]  # "error": connected, but status was refused


@dataclass(slots=True)
class NodeStatus:
    """One node's answer to `status`: the snapshot as sent (for --json) and decoded once."""

    node: str
    link: StatusLink
    error: str | None = None
    raw: dict[str, Any] | None = None
    snapshot: Snapshot | None = None
    unreadable: str | None = None  # why the snapshot did not decode (an agent of another build)

    @classmethod
    def answered(cls, node: str, raw: Any) -> NodeStatus:
        try:
            return cls(node, "connected", None, raw, msgspec.convert(raw, Snapshot))
        except msgspec.ValidationError as exc:
            return cls(node, "connected", None, raw, unreadable=str(exc))

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "link": self.link, "error": self.error,
                "snapshot": self.raw}


async def status_once(fleet: Fleet, nodes: list[Node], accept_new: bool
                      ) -> list[NodeStatus]:
    async def one(node: Node) -> NodeStatus:
        try:
            link = await open_link(node, accept_new)
        except (Unreachable, OSError) as exc:
            return NodeStatus(node.name, "unreachable", str(exc))
        try:
            snap = await link.call("status", {}, timeout=30)
            return NodeStatus.answered(node.name, snap)
        except (RpcError, ConnectionError, TimeoutError) as exc:
            return NodeStatus(node.name, "error", str(exc))
        finally:
            await link.close()

    return list(await asyncio.gather(*(one(n) for n in nodes)))


def _human(entry: NodeStatus, node: Node | None = None) -> str:
    snap = entry.snapshot
    # Names and messages from the node are shown escaped (console/sanitize.py).
    if entry.unreadable is not None:
        return f"{entry.node}: unreadable snapshot: {shown(entry.unreadable)}"
    if snap is None:
        return f"{entry.node}: {entry.link} - {shown(entry.error)}"
    line = f"{entry.node}: {snap.kind} {shown(snap.run)} {shown(snap.status)}"
    p = snap.progress
    if p is not None:
        eta = p.eta_hours
        line += (f"  {p.completed}/{p.total} done, {p.failed} failed, "
                 f"{truncated_split(p.truncated, p.truncated_loops)}"
                 f"{p.rate_per_sec:.2f}/s, ETA {'?' if eta is None else f'{eta:.2f} h'}")
        if eta and p.eta_p10_hours is not None:
            slow = "?" if p.eta_p90_hours is None else f"{p.eta_p90_hours:.2f}"
            line += f" (p10-p90 {p.eta_p10_hours:.2f}-{slow} h)"
        if p.tail:
            line += f", tail: {p.hedges} hedged, {p.hedges_won} won by the copy"
        cost = node.run_cost(p) if node is not None else p.cost
        if cost is not None:
            line += f", ${cost.usd:,.2f} so far"
            if cost.projected_usd is not None:
                line += f" (~${cost.projected_usd:,.2f} at the end)"
    t = snap.train
    if t is not None:
        line += f"  step {t.step}/{t.total_steps} loss {t.loss}"
    for s in snap.servers:
        line += "\n" + server_line(s)
    for a in snap.alerts:
        line += f"\n  ALERT {shown(a.severity)}: {shown(a.message)}"
        if a.actions:
            line += f" [{', '.join(shown(x) for x in a.actions)}]"
        if a.paged:
            line += " (paged by the node)"
    pg = snap.pager
    if pg is not None and (pg.posted or pg.pending or pg.dropped or pg.last_error):
        line += (f"\n  pages ({shown(pg.format)} webhook): {pg.posted} posted, "
                 f"{pg.pending} waiting, {pg.dropped} dropped")
        if pg.last_error:
            line += f"; last error: {shown(pg.last_error)}"
    return line


def truncated_split(truncated: int, loops: int) -> str:
    """`truncated N (loops L, long G), ` when answers were cut: loops gain nothing from a
    retry (`retry NODE truncated --long-only` sends the long ones)."""
    if not truncated:
        return ""
    return f"truncated {truncated} (loops {loops}, long {truncated - loops}), "


def server_line(s: ServerStatus) -> str:
    """One server as SGLang reports it (running, queue, generation throughput, KV usage and
    pool, requests it retracted recently, accept length): `–` for what it does not give,
    never 0. A server not up says below why its process exited, when its log said."""
    def fig(value: float | None, fmt: str) -> str:
        return DASH if value is None else format(value, fmt)

    accept = next((v for v in (s.accept_length, s.accept_length_window, s.accept_length_cum,
                               s.accept_length_log) if v is not None), None)
    kv = DASH if s.token_usage is None else f"{100 * s.token_usage:.0f}%"
    group = s.gpu_group
    on = f" (GPU {gpu_label(group)})" if group else ""
    if s.kv_capacity_tokens:
        kv += f" of {s.kv_capacity_tokens:,}"
    retracted = ""
    if s.retracted_recent:
        retracted = f", {s.retracted_recent} retracted recently"
        if s.retracted_total is not None:
            retracted += f" ({s.retracted_total} since it started)"
    line = (f"  server {s.number}{on} {shown(s.state)}: running {fig(s.running_reqs, 'd')}, "
            f"queue {fig(s.queued_reqs, 'd')}, {fig(s.gen_throughput, ',.0f')} tok/s, "
            f"KV {kv}{retracted}, accept {fig(accept, '.2f')}")
    if s.last_error and (s.exit_cause or s.restarts_stopped) and s.state != "healthy":
        line += f"\n    {shown(s.last_error)}"  # why it exited, and whether it comes back
    return line


def _alerting(entries: list[NodeStatus]) -> bool:
    return any(e.snapshot is not None and e.snapshot.alerts for e in entries)


async def cmd_status(fleet: Fleet, args: argparse.Namespace) -> int:
    target = getattr(args, "target", None)
    if target is not None and args.node is not None:
        say(f"fleetdeck status: give {target} or --node {args.node}, not both")
        return EXIT_USAGE
    name = target or args.node
    nodes = [fleet.node(name)] if name else fleet.nodes
    if not nodes:
        say(f"{fleet.source}: no nodes")
        return EXIT_USAGE
    while True:
        entries = await status_once(fleet, nodes, args.accept_new_host_key)
        # The whole fleet: each campaign's roll-up first (one run, one ETA), then the nodes.
        from console.queue import rollup

        rollups = [rollup.roll_up(fleet, c, [rollup.Member(e.node, e.link, e.snapshot, e.error)
                                             for e in entries if e.node in c.nodes])
                   for c in fleet.campaigns] if name is None else []
        if args.json:
            out: dict[str, Any] = {"time": time.time(), "nodes": [e.to_json() for e in entries]}
            if rollups:
                out["campaigns"] = [msgspec.to_builtins(r) for r in rollups]
            print(json.dumps(out), flush=True)
        else:
            for r in rollups:
                print(shown(rollup.human(r)[0]), flush=True)
            for e in entries:
                print(_human(e, fleet.node(e.node)), flush=True)
        if args.exit_on_alert and _alerting(entries):
            return EXIT_CHECK
        if not args.watch:
            break
        await asyncio.sleep(args.interval)
    if any(e.link != "connected" for e in entries):
        return EXIT_UNREACHABLE
    return EXIT_OK


VERB_PARAMS: dict[str, Any] = {
    "stop": lambda a: {"servers": a.servers},
    "down": lambda a: {},
    "pause": lambda a: {},
    "unpause": lambda a: {},
    "resume": lambda a: {},
    "resize": lambda a: {"value": a.value, **({"server": a.server} if a.server is not None
                                              else {})},
    "max_tokens": lambda a: {"value": a.value},
    "retry": lambda a: {"what": a.what, **({"long_only": True} if a.long_only else {})},
    "restart_server": lambda a: {"server": a.server},
    "logs": lambda a: {"name": a.name, "n": a.n},
    "samples": lambda a: {"n": a.n},
    "verify": lambda a: {},
    "export": lambda a: {"checkpoint": a.checkpoint},
    "launch": lambda a: {"spec": a.spec} if a.spec else {},
}


async def cmd_verb(fleet: Fleet, args: argparse.Namespace) -> int:
    method = args.method
    action = BY_ID.get(method)
    if action is not None and action.dangerous:
        if fleet.console.read_only or args.read_only:
            say(f"fleetdeck {args.command}: not allowed in read-only mode")
            return EXIT_USAGE
        if not args.yes:
            say(f"fleetdeck {args.command}: a dangerous action on {args.node_name}; add --yes")
            return EXIT_USAGE
    node = fleet.node(args.node_name)
    params = VERB_PARAMS[method](args)
    if method == "launch" and "spec" not in params and node.spec:
        params["spec"] = node.spec
    try:
        link = await open_link(node, args.accept_new_host_key)
    except (Unreachable, OSError) as exc:
        say(str(exc))
        return EXIT_UNREACHABLE
    if method == "logs":
        from console.logverb import print_log

        try:
            return await print_log(link, node.name, args)
        finally:
            await link.close()
    try:
        result = await link.call(method, params, timeout=args.timeout)
    except RpcError as exc:
        say(f"{node.name}: {method}: {shown(exc.message)}")
        # Bad parameters (a per-server resize of a router run) are a usage error, as the
        # agent's own verb says; a refusal of a valid request is a failed check.
        return EXIT_USAGE if exc.code == INVALID_PARAMS else EXIT_CHECK
    except (ConnectionError, TimeoutError) as exc:
        say(shown(exc))
        return EXIT_UNREACHABLE
    finally:
        await link.close()
    if method == "verify":
        print(json.dumps(result))
        return EXIT_OK if result.get("ok") else EXIT_CHECK
    else:
        print(json.dumps(result))
    return EXIT_OK


def _resize_value(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number or auto, not {text!r}") from None


def add_verbs(sub: Any) -> None:
    def verb(name: str, method: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
        p.add_argument("node_name", metavar="NODE", help="a node, or a campaign: every node "
                       "of it gets the call (launch, status and the control verbs)")
        p.set_defaults(method=method, runner=cmd_verb)
        if BY_ID.get(method) and BY_ID[method].dangerous:
            p.add_argument("--yes", action="store_true", help="confirm a dangerous action")
        else:
            p.set_defaults(yes=True)
        return p

    p = verb("launch", "launch", "start the run on NODE (its spec, or --spec PATH on the node); "
             "on a CAMPAIGN every node not yet running it, after a check round on them (a node "
             "added to the campaign joins a running one this way)")
    p.add_argument("--spec", default=None)
    p.add_argument("--only", action="append", default=None, metavar="NODE",
                   help="a CAMPAIGN: launch only this node (repeatable)")
    p = verb("stop", "stop", "drain and stop the job (servers stay)")
    p.add_argument("--servers", action="store_true")
    verb("down", "down", "stop job, servers and supervisor")
    verb("pause", "pause", "stop sending new requests")
    verb("unpause", "unpause", "send requests again")
    verb("resume", "resume", "restart a dead supervisor or a stopped job")
    p = verb("resize", "resize", "requests in flight per server (a number, or auto: each "
             "server finds its best level)")
    p.add_argument("value", type=_resize_value)
    p.add_argument("--server", type=int, default=None)
    p = verb("max-tokens", "max_tokens", "max tokens for new requests")
    p.add_argument("value", type=int)
    p = verb("retry", "retry", "re-queue failed or truncated indices; on a generation "
             "CAMPAIGN a new generation over the indices its commits mark so, which every "
             "node runs")
    p.add_argument("what", choices=["failed", "truncated"])
    p.add_argument("--max-tokens", type=int, default=None,
                   help="a CAMPAIGN: the new generation's max_tokens (else each node's)")
    p.add_argument("--long-only", action="store_true",
                   help="truncated: only the long answers, not those cut in a repetition "
                   "loop (more tokens buy a loop nothing)")
    p = verb("restart-server", "restart_server", "restart one server")
    p.add_argument("server", type=int)
    p = verb("logs", "logs", "tail a log (generate, supervisor, sglang_gpuN); --follow "
             "prints what it gains until Ctrl-C")
    p.add_argument("name", nargs="?", default="generate")
    p.add_argument("-n", type=int, default=50, help="lines of the tail (at most 5000)")
    p.add_argument("--follow", "-f", action="store_true",
                   help="then print new lines as they come (one call a second over the same "
                   "connection), until Ctrl-C")
    p.add_argument("--interval", type=float, default=1.0, help="--follow: seconds between calls")
    p = verb("samples", "samples", "the latest completions")
    p.add_argument("-n", type=int, default=5)
    p = verb("verify", "verify", "check S3 and the counts on the node; a CAMPAIGN: the proof "
             "from its commits (every index committed once, every named batch's checksum)")
    p.add_argument("--deep", type=float, default=0.0, metavar="SHARE",
                   help="a CAMPAIGN: also read this share (0..1) of the batch bodies")
    p.add_argument("--json", action="store_true")
    p = verb("export", "export", "a training node: write the drafter's serving folder "
             "(RUN_DIR/export) as a job; its log is `logs NODE export`")
    p.add_argument("--checkpoint", choices=["best", "latest"], default="best")


def run_async(coro: Any) -> int:
    try:
        code: int = asyncio.run(coro)
        return code
    except FleetError as exc:
        say(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def load(args: argparse.Namespace) -> Fleet:
    return load_fleet(args.fleet)


__all__ = ["add_verbs", "cmd_status", "cmd_verb", "load", "run_async"]
