"""`fleetdeck resume-from-s3 NODE`: a node whose disk was lost (or a new node in its place)
gets the run directory rebuilt from the run's S3 prefix by its agent, and the run continues
there. One RPC (`resume_from_s3`) to the node's `serve --stdio`; dangerous, as launch is."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agents.rpc.protocol import RpcError
from console.fleet import Fleet
from console.headless import EXIT_CHECK, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, open_link, say
from console.sanitize import shown
from console.transport import Unreachable


def add(sub: Any) -> None:
    p = sub.add_parser("resume-from-s3", help="NODE's disk was lost: rebuild its run directory "
                       "from the run's S3 prefix and continue the run there")
    p.add_argument("node_name", metavar="NODE")
    p.add_argument("--spec", default=None, help="the run.toml on the node (default: the "
                   "node's spec in the fleet file)")
    p.add_argument("--retry-failed", action="store_true",
                   help="send the indices that failed again (by default they stay failed)")
    p.add_argument("--yes", action="store_true", help="confirm a dangerous action")
    p.set_defaults(runner=cmd_resume_from_s3)


async def cmd_resume_from_s3(fleet: Fleet, args: argparse.Namespace) -> int:
    if fleet.console.read_only or args.read_only:
        say("fleetdeck resume-from-s3: not allowed in read-only mode")
        return EXIT_USAGE
    if not args.yes:
        say(f"fleetdeck resume-from-s3: a dangerous action on {args.node_name}; add --yes")
        return EXIT_USAGE
    node = fleet.node(args.node_name)
    spec = args.spec or node.spec
    if not spec:
        say(f"fleetdeck resume-from-s3: {node.name} has no spec in {fleet.source}; give --spec "
            "(the run.toml on the node)")
        return EXIT_USAGE
    try:
        link = await open_link(node, args.accept_new_host_key)
    except (Unreachable, OSError) as exc:
        say(str(exc))
        return EXIT_UNREACHABLE
    try:
        result = await link.call("resume_from_s3", {"spec": spec,
                                                    "retry_failed": args.retry_failed},
                                 timeout=args.timeout)
    except RpcError as exc:
        say(f"{node.name}: resume-from-s3: {shown(exc.message)}")
        return EXIT_CHECK
    except (ConnectionError, TimeoutError) as exc:
        say(shown(exc))
        return EXIT_UNREACHABLE
    finally:
        await link.close()
    print(json.dumps(result))
    return EXIT_OK
