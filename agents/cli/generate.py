"""`fleetdeck-agent generate RUN.toml`: the generation engine in the foreground, for runs
whose servers are given by URL (a supervised run starts it itself)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from agents.cli.exits import EXIT_USAGE


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("generate", help="run the generation engine in the foreground")
    p.add_argument("spec", type=Path, metavar="RUN.toml")
    p.set_defaults(handler=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from agents.engine import EngineError
    from agents.engine.run import run_engine
    from agents.engine.store import StoreError
    from agents.engine.uploader import S3Unavailable
    from agents.rundir.spec import SpecError, load_spec

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    # One INFO line per request would drown the run's own narration.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        spec = load_spec(args.spec)
        if spec.run.kind != "generate":
            print(f"fleetdeck-agent generate: {args.spec}: [run] kind is {spec.run.kind!r}",
                  file=sys.stderr)
            return EXIT_USAGE
        if not spec.servers.urls:
            print(f"fleetdeck-agent generate: {args.spec}: [servers] has gpus, not urls: "
                  "servers launched per GPU need the supervisor (`fleetdeck-agent up`)",
                  file=sys.stderr)
            return EXIT_USAGE
        if spec.servers.router:
            from agents.engine.router import check_router

            check_router(spec.servers.urls[0], spec.servers.api_key,
                         where=f"{spec.source}: [servers] urls[0]")
        return run_engine(spec)
    except (SpecError, EngineError, S3Unavailable, StoreError) as exc:
        print(f"fleetdeck-agent generate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"fleetdeck-agent generate: {exc.filename or ''}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_USAGE
