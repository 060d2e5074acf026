"""`fleetdeck`: with no command, the TUI; with a command, the headless console (which never
imports Textual: the TUI module is imported only when the TUI is asked for)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agents import __version__
from console import headless


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetdeck", description="fleetdeck: operations console for multi-GPU LLM runs. "
        "Without a command it opens the TUI on the fleet file.")
    parser.add_argument("--version", action="version", version=f"fleetdeck {__version__}")
    parser.add_argument("--fleet", default=None, help="the fleet file (default: "
                        "~/.config/fleetdeck/fleet.toml)")
    parser.add_argument("--read-only", action="store_true",
                        help="no dangerous actions (stop, down, restart, launch) and no shell")
    parser.add_argument("--accept-new-host-key", action="store_true",
                        help="trust an unknown host key (never a changed one)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per call, seconds")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("status", help="status of every node (or one node, or a campaign's "
                       "roll-up: status NAME)")
    p.add_argument("target", nargs="?", default=None, metavar="NAME",
                   help="a node, or a campaign (one roll-up of its shards)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--watch", action="store_true")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--node", default=None)
    p.add_argument("--exit-on-alert", action="store_true")
    p.set_defaults(runner=headless.cmd_status)
    headless.add_verbs(sub)
    from console import extra_verbs

    extra_verbs.add(sub)
    demo = sub.add_parser("demo", help="a simulated 7-GPU generation node, in the TUI")
    demo.add_argument("--headless", action="store_true", help="JSON status lines, no TUI")
    demo.add_argument("--duration", type=float, default=None, help="seconds, then exit")
    demo.add_argument("--prompts", type=int, default=20000)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from console.demo import run_demo

        return run_demo(args)
    if args.command is None:
        from console.tui.main import run_tui

        return run_tui(args)
    runner = getattr(args, "runner", None)
    if runner is None:
        parser.error(f"no handler for {args.command}")
    if getattr(args, "sync", False):
        code: int = runner(args)
        return code
    try:
        fleet = headless.load(args)
    except headless.FleetError as exc:
        print(str(exc), file=sys.stderr)
        return headless.EXIT_USAGE
    # A campaign's name where a node's goes: the campaign's own verbs (console/queue).
    from console.queue.verbs import for_campaign

    return headless.run_async(for_campaign(fleet, args, runner)(fleet, args))


if __name__ == "__main__":
    sys.exit(main())
