"""`fleetdeck-agent serve RUN_DIR --stdio`: relay RPC for a console over this process's
stdio (one per console SSH session)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("serve", help="relay RPC for a console over this process's stdio")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--stdio", action="store_true", required=True)
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from agents.rpc.serve import serve_stdio

    return asyncio.run(serve_stdio(args.run_dir))
