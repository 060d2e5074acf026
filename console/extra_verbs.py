"""Console verbs beyond the RPC table: bootstrap (and, with the artifacts work, pull and
decommission-check). Registered on the headless parser."""

from __future__ import annotations

from typing import Any


def add(sub: Any) -> None:
    from console import bootstrap

    p = sub.add_parser("bootstrap", help="install or upgrade the agent on NODE over SSH")
    p.add_argument("node_name", metavar="NODE")
    p.set_defaults(runner=bootstrap.cmd_bootstrap)
