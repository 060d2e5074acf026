"""What is failing on a node: its `failures` answer (failures.jsonl grouped by error class on
the node) fetched, checked and said in words, for `fleetdeck failures NODE [--json]` and the
TUI's failures screen. Everything the node sends is decoded against the schema's bounds and
shown escaped (console/sanitize.py). Never imports Textual."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import msgspec

from agents.rpc.protocol import RpcError
from agents.rundir.schema import FailureGroup, FailureSummary
from console.fleet import Fleet
from console.headless import EXIT_CHECK, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, open_link, say
from console.sanitize import shown
from console.transport import AgentLink, Unreachable

# A call reads at most 8 MiB of the journal on the node (agents/rundir/failsummary.py); a
# journal of millions of lines is read over several calls. Headless asks until it is read
# through, stops moving, or 2 GiB were read (then it says how far it got).
MAX_ROUNDS = 256

_FAILED = {
    "timeout": "timeout",
    "deadline": "deadline missed",
    "aborted": "aborted by the server",
    "bad_input": "bad input",
    "connect": "server down (cannot connect)",
    "transport": "connection broken",
    "bad_response": "bad response",
}
_REQUEUED = {
    "deadline": "deadline missed, sent again",
    "failed": "retry failed",
    "truncated": "retry truncated",
}


class BadAnswer(ValueError):
    """A `failures` answer that does not fit the schema: the node's words, not shown."""


def decode(raw: Any) -> FailureSummary:
    try:
        return msgspec.convert(raw, FailureSummary)
    except msgspec.ValidationError as exc:
        raise BadAnswer(f"an unreadable failures answer: {exc}") from None


async def fetch(link: AgentLink, timeout: float = 120.0,
                on_step: Callable[[FailureSummary], None] | None = None) -> FailureSummary:
    """The node's summary, asked again while it reads on (each answer covers more of the
    journal), until it is read through, stops moving or MAX_ROUNDS passed. `on_step` sees
    each answer that is not the last (the TUI shows them as they come)."""
    summary = decode(await link.call("failures", {}, timeout=timeout))
    for _ in range(MAX_ROUNDS - 1):
        if summary.complete:
            break
        if on_step is not None:
            on_step(summary)
        more = decode(await link.call("failures", {}, timeout=timeout))
        moved = more.bytes_read != summary.bytes_read
        summary = more
        if not moved:
            break
    return summary


def class_label(event: str, error: str) -> str:
    """The error class in words (escaped: it is the node's string)."""
    if event == "failed":
        if error.startswith("http_") and error[5:].isascii() and error[5:].isdigit():
            return f"HTTP {error[5:]}"
        return _FAILED.get(error, shown(error))
    if event == "requeued":
        return _REQUEUED.get(error, f"requeued: {shown(error)}")
    return f"{shown(event)}: {shown(error)}"


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"


def servers_text(g: FailureGroup) -> str:
    parts = [f"{s.server} ({s.count:,})" for s in g.servers]
    if g.servers_more:
        parts.append(f"{g.servers_more:,} on others")
    if g.no_server:
        parts.append(f"{g.no_server:,} on none")
    return ", ".join(parts) or "–"


def headline(s: FailureSummary) -> str:
    failed = sum(g.count for g in s.groups if g.event == "failed")
    requeued = sum(g.count for g in s.groups if g.event == "requeued")
    text = (f"{failed:,} failed and {requeued:,} requeued in {len(s.groups)} "
            f"class{'es' if len(s.groups) != 1 else ''}")
    if s.other:
        text += f", {s.other:,} in further classes"
    if s.retries:
        text += f"; {s.retries:,} retry request{'s' if s.retries != 1 else ''} applied"
    if s.unreadable:
        text += f"; {s.unreadable:,} unreadable line{'s' if s.unreadable != 1 else ''} skipped"
    if not s.complete:
        text += (f" (read {_size(s.bytes_read)} of {_size(s.bytes_total)} of failures.jsonl "
                 "so far: ask again)")
    return text


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    x = n / 1024
    for unit in ("KiB", "MiB"):
        if x < 1024:
            return f"{x:,.1f} {unit}"
        x /= 1024
    return f"{x:,.1f} GiB"


def human(node: str, s: FailureSummary, examples: int = 1) -> str:
    """The summary as lines of text, each class with its figures and its latest example."""
    lines = [f"{node}: {headline(s)}"]
    if not s.groups and not s.other:
        lines.append("  nothing has failed")
    for g in s.groups:
        lines.append(f"  {shown(g.event):<8} {class_label(g.event, g.error):<32} {g.count:>10,}  "
                     f"first {utc(g.first)}  last {utc(g.last)}  servers {servers_text(g)}")
        for e in g.examples[-examples:] if examples else []:
            lines.append(f"      line {e.line}: {shown(e.text)}")
    return "\n".join(lines)


async def cmd_failures(fleet: Fleet, args: argparse.Namespace) -> int:
    node = fleet.node(args.node_name)
    try:
        link = await open_link(node, args.accept_new_host_key)
    except (Unreachable, OSError) as exc:
        say(str(exc))
        return EXIT_UNREACHABLE
    try:
        summary = await fetch(link, timeout=args.timeout)
    except RpcError as exc:
        say(f"{node.name}: failures: {shown(exc.message)}")
        return EXIT_CHECK
    except BadAnswer as exc:
        say(f"{node.name}: {shown(exc)}")
        return EXIT_USAGE  # as pull does with a malformed manifest: bad input from the node
    except (ConnectionError, TimeoutError) as exc:
        say(shown(exc))
        return EXIT_UNREACHABLE
    finally:
        await link.close()
    if args.json:
        print(json.dumps({"node": node.name, "failures": msgspec.to_builtins(summary)}))
    else:
        print(human(node.name, summary, examples=args.examples))
    return EXIT_OK


def add(sub: Any) -> None:
    p = sub.add_parser("failures", help="what is failing on NODE: failures and requeues "
                       "grouped by error class, with counts, first and last time, servers and "
                       "example lines (from the run's failures.jsonl)")
    p.add_argument("node_name", metavar="NODE")
    p.add_argument("--json", action="store_true")
    p.add_argument("--examples", type=int, default=1, choices=range(4), metavar="N",
                   help="example lines per class, 0 to 3 (default 1)")
    p.set_defaults(runner=cmd_failures)


__all__ = ["BadAnswer", "add", "class_label", "cmd_failures", "decode", "fetch", "human"]
