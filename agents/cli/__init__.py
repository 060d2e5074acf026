"""`fleetdeck-agent`: the node agent's headless command line (one verb per action)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from agents import __version__

# Verbs whose start someone waits for, many times over (a pull starts one per stream): their
# module is imported alone, not with every verb's (~50 ms less a start, measured).
LIGHT = {"send-files": "agents.cli.stream"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every verb's parser; `only` (a LIGHT verb): that verb's alone."""
    parser = argparse.ArgumentParser(
        prog="fleetdeck-agent",
        description="fleetdeck node agent: generation engine, SGLang simulator, run control.",
    )
    parser.add_argument("--version", action="version", version=f"fleetdeck-agent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if only is not None:
        importlib.import_module(LIGHT[only]).add_parsers(sub)
        return parser
    from agents.cli import control, generate, inspect, lifecycle, serve, stream
    from agents.sim import cli as sim_cli

    sim_cli.add_parser(sub)
    for verbs in (generate, control, inspect, stream, lifecycle, serve):
        verbs.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in LIGHT else None)
    args = parser.parse_args(words)
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
