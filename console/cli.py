"""`fleetdeck`: the console's headless commands. Never imports Textual (the TUI is separate)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agents import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetdeck", description="fleetdeck: operations console for multi-GPU LLM runs."
    )
    parser.add_argument("--version", action="version", version=f"fleetdeck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="the embedded demo (arrives with the Console issue)")
    demo.add_argument("--headless", action="store_true")
    demo.add_argument("--duration", type=float, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "demo":
        print(
            "fleetdeck demo: not built yet - the TUI and the embedded demo arrive with the "
            "Console issue. Today: `fleetdeck-agent sim-server` and `fleetdeck-agent generate`.",
            file=sys.stderr,
        )
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
