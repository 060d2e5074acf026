"""`send-files` (pull's stream: console/artifacts/streamed.py). A pull starts one per stream,
and the pull waits for it: this module imports nothing at its top that the verb does not need,
and `fleetdeck-agent send-files` imports it alone (agents/cli/__init__.py LIGHT)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agents.cli.exits import usage_error


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("send-files", help="the files asked for on stdin as one framed stream "
                       "on stdout (fleetdeck pull's streamed data path)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.set_defaults(handler=cmd_send_files)


def cmd_send_files(args: argparse.Namespace) -> int:
    from agents.artifacts.send import serve

    if not args.run_dir.is_dir():
        return usage_error("send-files", ValueError(f"{args.run_dir}: no such directory"))
    sys.stdout.flush()
    return serve(args.run_dir, sys.stdin.buffer, sys.stdout.fileno())
