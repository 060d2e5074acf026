"""Headless verbs for supervised runs: `up`, `stop`, `down`, `resume`, `restart-server`,
`logs`, `samples`, `manifest`, `verify`, and `serve --stdio` for the console. Each maps one
to one onto an RPC."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from agents.rpc.protocol import RpcError
from agents.rundir.spec import SpecError, load_spec
from agents.supervise.launch import RunCtlError, call, connect, resume, up

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("up", help="start a run: supervisor, servers and job, detached")
    p.add_argument("spec", type=Path, metavar="RUN.toml")
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

    p = sub.add_parser("restart-server", help="restart one server")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("server", type=int, metavar="N")
    p.add_argument("--yes", action="store_true", help="confirm (a dangerous action)")
    p.set_defaults(handler=cmd_restart_server)

    p = sub.add_parser("logs", help="the tail of a log (generate, supervisor, sglang_gpuN)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-n", type=int, default=50)
    p.set_defaults(handler=cmd_logs)

    p = sub.add_parser("samples", help="the latest completions, to look at")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("-n", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_samples)

    p = sub.add_parser("manifest", help="every artifact of the run with size, mtime and sha256")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--prefix", default="", help="only what lies under this relative path")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_manifest)

    p = sub.add_parser("verify", help="S3 against uploads.jsonl, and the counts against "
                                      "each other (exit 1 when a check fails)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("serve", help="relay RPC for a console over this process's stdio")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--stdio", action="store_true", required=True)
    p.set_defaults(handler=cmd_serve)


def _err(verb: str, exc: Exception) -> int:
    print(f"fleetdeck-agent {verb}: {exc}", file=sys.stderr)
    return EXIT_USAGE


def _needs_yes(args: argparse.Namespace, verb: str) -> bool:
    if not args.yes:
        print(f"fleetdeck-agent {verb}: a dangerous action; add --yes to confirm",
              file=sys.stderr)
        return False
    return True


def cmd_up(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec)
        result = asyncio.run(up(spec))
    except (SpecError, RunCtlError, ValueError) as exc:
        return _err("up", exc)
    print(json.dumps(result))
    return EXIT_OK


def _rpc(verb: str, run_dir: Path, method: str, params: dict[str, Any]) -> int:
    try:
        result = asyncio.run(call(run_dir.resolve(), method, params))
    except RunCtlError as exc:
        return _err(verb, exc)
    except RpcError as exc:
        print(f"fleetdeck-agent {verb}: {exc.message}", file=sys.stderr)
        return EXIT_CHECK
    print(json.dumps(result))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    if not _needs_yes(args, "stop"):
        return EXIT_USAGE
    return _rpc("stop", args.run_dir, "stop", {"servers": args.servers})


def cmd_down(args: argparse.Namespace) -> int:
    if not _needs_yes(args, "down"):
        return EXIT_USAGE
    return _rpc("down", args.run_dir, "down", {})


def cmd_restart_server(args: argparse.Namespace) -> int:
    if not _needs_yes(args, "restart-server"):
        return EXIT_USAGE
    return _rpc("restart-server", args.run_dir, "restart_server", {"server": args.server})


def cmd_resume(args: argparse.Namespace) -> int:
    try:
        result = asyncio.run(resume(args.run_dir.resolve()))
    except RunCtlError as exc:
        return _err("resume", exc)
    except RpcError as exc:
        print(f"fleetdeck-agent resume: {exc.message}", file=sys.stderr)
        return EXIT_CHECK
    print(json.dumps(result))
    return EXIT_OK


def _local(run_dir: Path, method: str, params: dict[str, Any]) -> Any:
    from agents.rpc.methods import ControlMethods

    handler = ControlMethods(run_dir.resolve()).methods()[method]

    async def go() -> Any:
        return await handler(params)

    return asyncio.run(go())


def cmd_logs(args: argparse.Namespace) -> int:
    try:
        result = _local(args.run_dir, "logs", {"name": args.name, "n": args.n})
    except RpcError as exc:
        print(f"fleetdeck-agent logs: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    for line in result["lines"]:
        print(line)
    return EXIT_OK


def cmd_samples(args: argparse.Namespace) -> int:
    result = _local(args.run_dir, "samples", {"n": args.n})
    if args.json:
        print(json.dumps(result))
        return EXIT_OK
    for s in result["samples"]:
        print(f"#{s['index']} {s['finish_reason']} {s['completion_tokens']} tokens "
              f"(reasoning {s['reasoning_tokens']}), attempt {s['attempt']}")
        print(f"  reasoning: {s['reasoning_head'][:200]!r}")
        print(f"  answer:    {s['content_head'][:200]!r}")
    return EXIT_OK


def cmd_manifest(args: argparse.Namespace) -> int:
    from agents.artifacts.manifest import Manifest
    from agents.rundir.browse import OutsideRunDir

    if not args.run_dir.is_dir():
        return _err("manifest", ValueError(f"{args.run_dir}: no such directory"))
    try:
        entries = Manifest(args.run_dir.resolve()).entries(args.prefix)
    except OutsideRunDir as exc:
        return _err("manifest", exc)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode({"entries": entries, "total": len(entries)})
                                + b"\n")
        return EXIT_OK
    for e in entries:
        flags = " ".join(f for f in (("in_s3" if e.in_s3 else ""),
                                     (f"refused:{e.refused}" if e.refused else "")) if f)
        print(f"{e.kind:<10} {e.size:>12} {(e.sha256 or '-')[:16]:<16} {e.path}"
              + (f"  [{flags}]" if flags else ""))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from agents.artifacts.verify import VerifyError, verify_run

    try:
        report = verify_run(args.run_dir.resolve())
    except VerifyError as exc:
        return _err("verify", exc)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(report) + b"\n")
    else:
        for check in report.checks:
            detail = check.detail
            if not check.ok and len(detail) > 150:  # the problems follow, one a line
                detail = detail[:150] + "..."
            print(f"{'ok  ' if check.ok else 'FAIL'}  {check.name}: {detail}")
        for problem in report.problems:
            print(f"  - {problem}")
        c = report.counted
        print(f"counted: {c.done_indices} done, {c.current_lines} current lines "
              f"({c.open_batch_lines} in the open batch), {c.closed_batches} closed batches, "
              f"{c.s3_objects if c.s3_objects is not None else '?'} S3 objects; "
              f"{report.elapsed_s:.1f} s")
    if not report.ok:
        n = len(report.problems)
        print(f"fleetdeck-agent verify: {n} problem{'s' if n != 1 else ''} in {args.run_dir}",
              file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_CHECK


def cmd_serve(args: argparse.Namespace) -> int:
    from agents.rpc.serve import serve_stdio

    return asyncio.run(serve_stdio(args.run_dir))


def supervised_status(run_dir: Path) -> bytes | None:
    """The live snapshot from the supervisor, or None when none runs."""

    async def ask() -> Any:
        client = await connect(run_dir.resolve())
        if client is None:
            return None
        try:
            return await client.call("status", {})
        finally:
            await client.close()

    result = asyncio.run(ask())
    return msgspec.json.encode(result) if result is not None else None


