"""`fleetdeck` with no command: open the TUI on the fleet file. The only door into Textual:
the headless commands never import this module."""

from __future__ import annotations

import argparse
import sys

from console.fleet import Fleet, FleetError, load_fleet
from console.tui.app import FleetdeckApp

EXIT_USAGE = 2

__all__ = ["FleetdeckApp", "run_app", "run_tui"]


def run_app(fleet: Fleet, read_only: bool = False, accept_new_host_key: bool = False,
            note: str | None = None, exit_after: float | None = None) -> int:
    app = FleetdeckApp(fleet, read_only=read_only, accept_new_host_key=accept_new_host_key,
                       note=note, exit_after=exit_after, quiet_gc=True)
    code = app.run()
    return code or 0


def run_tui(args: argparse.Namespace) -> int:
    try:
        fleet = load_fleet(args.fleet)
    except FleetError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    if not fleet.nodes:
        print(f"{fleet.source}: no nodes; add a [[nodes]] table", file=sys.stderr)
        return EXIT_USAGE
    return run_app(fleet, read_only=bool(args.read_only),
                   accept_new_host_key=bool(getattr(args, "accept_new_host_key", False)))
