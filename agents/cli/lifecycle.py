"""Verbs that start and stop a supervised run: `up`, `stop`, `down`, `resume`,
`resume-from-s3` and `restart-server`. Each maps one to one onto an RPC to the run's
supervisor (`resume-from-s3`: to `serve --stdio`, as there is none); `up --wait` then holds
the run in the foreground (foreground.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents.cli.exits import EXIT_CHECK, EXIT_OK, EXIT_USAGE, needs_yes, usage_error
from agents.rpc.protocol import RpcError
from agents.rundir.spec import SpecError, load_spec
from agents.supervise.launch import RunCtlError, call, resume, up


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("up", help="start a run: supervisor, servers and job, detached")
    p.add_argument("spec", type=Path, metavar="RUN.toml")
    p.add_argument("--node", metavar="NAME",
                   help="this machine's name in a campaign's queue: sets [queue] node (one "
                   "spec for every node of a job array)")
    p.add_argument("--wait", action="store_true",
                   help="stay in the foreground until the job ends, then take the servers and "
                   "the supervisor down (a scheduler's task: nothing may outlive it). "
                   "SIGTERM or SIGINT drains the job and goes down; a second stops waiting. "
                   "Exit 0: done; 4: failed; 5: stopped; 6: the supervisor died; 7: gave up "
                   "waiting on a second signal")
    p.set_defaults(handler=cmd_up)

    p = sub.add_parser("stop", help="drain and stop the job (servers stay up)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--servers", action="store_true", help="stop the servers too")
    p.add_argument("--yes", action="store_true", help="confirm (a dangerous action)")
    p.set_defaults(handler=cmd_stop)

    p = sub.add_parser("down", help="stop the job, the servers and the supervisor")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--yes", action="store_true", help="confirm (a dangerous action)")
    p.set_defaults(handler=cmd_down)

    p = sub.add_parser("resume", help="continue a run; starts a supervisor if none runs")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.set_defaults(handler=cmd_resume)

    p = sub.add_parser("resume-from-s3", help="a run whose node disk is lost: rebuild its run "
                       "directory here from its S3 prefix (batches, failures, pin), then "
                       "continue it, sending only what S3 lacks")
    p.add_argument("spec", type=Path, metavar="RUN.toml")
    p.add_argument("--retry-failed", action="store_true",
                   help="send the indices that failed again (by default they stay failed)")
    p.set_defaults(handler=cmd_resume_from_s3)

    p = sub.add_parser("restart-server", help="restart one server")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("server", type=int, metavar="N")
    p.add_argument("--yes", action="store_true", help="confirm (a dangerous action)")
    p.set_defaults(handler=cmd_restart_server)


def cmd_up(args: argparse.Namespace) -> int:
    overrides = {"queue": {"node": args.node}} if args.node is not None else None
    try:
        spec = load_spec(args.spec, overrides=overrides)
        if args.wait:
            from agents.cli.foreground import up_and_wait  # httpx: only when it waits

            ending = asyncio.run(up_and_wait(spec))
        else:
            result = asyncio.run(up(spec))
    except (SpecError, RunCtlError, ValueError) as exc:
        return usage_error("up", exc)
    if args.wait:
        print(f"fleetdeck-agent up: {ending.line}", file=sys.stderr)
        return ending.code
    print(json.dumps(result))
    return EXIT_OK


def _rpc(verb: str, run_dir: Path, method: str, params: dict[str, Any]) -> int:
    try:
        result = asyncio.run(call(run_dir.resolve(), method, params))
    except RunCtlError as exc:
        return usage_error(verb, exc)
    except RpcError as exc:
        print(f"fleetdeck-agent {verb}: {exc.message}", file=sys.stderr)
        return EXIT_CHECK
    print(json.dumps(result))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    if not needs_yes(args, "stop"):
        return EXIT_USAGE
    return _rpc("stop", args.run_dir, "stop", {"servers": args.servers})


def cmd_down(args: argparse.Namespace) -> int:
    if not needs_yes(args, "down"):
        return EXIT_USAGE
    return _rpc("down", args.run_dir, "down", {})


def cmd_restart_server(args: argparse.Namespace) -> int:
    if not needs_yes(args, "restart-server"):
        return EXIT_USAGE
    return _rpc("restart-server", args.run_dir, "restart_server", {"server": args.server})


def cmd_resume(args: argparse.Namespace) -> int:
    try:
        result = asyncio.run(resume(args.run_dir.resolve()))
    except RunCtlError as exc:
        return usage_error("resume", exc)
    except RpcError as exc:
        print(f"fleetdeck-agent resume: {exc.message}", file=sys.stderr)
        return EXIT_CHECK
    print(json.dumps(result))
    return EXIT_OK


def cmd_resume_from_s3(args: argparse.Namespace) -> int:
    from agents.artifacts.restore import RestoreRefused, restore_run_dir
    from agents.engine import EngineError

    try:
        spec = load_spec(args.spec)
        restored = restore_run_dir(spec, retry_failed=args.retry_failed)
        started = asyncio.run(up(spec))
    except (SpecError, RestoreRefused, EngineError, RunCtlError, ValueError) as exc:
        return usage_error("resume-from-s3", exc)
    print(json.dumps({**restored.to_json(), **started}))
    return EXIT_OK
