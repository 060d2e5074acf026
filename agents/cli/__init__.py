"""`fleetdeck-agent`: the node agent's headless command line (one verb per action)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agents import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetdeck-agent",
        description="fleetdeck node agent: generation engine, SGLang simulator, run control.",
    )
    parser.add_argument("--version", action="version", version=f"fleetdeck-agent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from agents.cli import control, generate, inspect, lifecycle, serve
    from agents.sim import cli as sim_cli

    sim_cli.add_parser(sub)
    for verbs in (generate, control, inspect, lifecycle, serve):
        verbs.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "sim-server":
        from agents.sim import cli as sim_cli

        return sim_cli.run(args)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"no handler for {args.command}")
    code: int = handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
