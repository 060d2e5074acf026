"""Verbs that look at a run and change nothing: `status`, `logs`, `samples`, `failures`,
`manifest`, `verify` and `verify-union` (a campaign's, from
S3)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from agents.cli.exits import EXIT_CHECK, EXIT_OK, EXIT_USAGE, usage_error
from agents.rpc.protocol import RpcError
from agents.supervise.launch import connect


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("status", help="the run's progress, from its run directory")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="the snapshot as JSON on stdout")
    p.set_defaults(handler=cmd_status)

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

    p = sub.add_parser("failures", help="failures.jsonl by error class: counts, first and "
                       "last time, servers, the latest example line")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_failures)

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

    p = sub.add_parser("queue", help="a campaign node's queue, from its run dir's [s3]: "
                       "status, verify (from the commits), retry, give-back")
    p.add_argument("what", choices=("status", "verify", "retry", "give-back"))
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--deep", type=float, default=0.0,
                   help="verify: also read this share (0..1) of the batch bodies")
    p.add_argument("--retry", choices=("failed", "truncated"), default="truncated",
                   help="retry: which indices the new generation redoes")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="retry: the new generation's max_tokens")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_queue)


def status_bytes(run_dir: Path) -> bytes | None:
    """The snapshot as JSON: the live supervisor's, or read from the run directory when none
    runs; None when `run_dir` is not a run directory."""
    from agents.rundir.schema import encoder
    from agents.rundir.spec import SpecError, load_run_spec
    from agents.supervise.snapshot import from_disk

    if not (run_dir / "run.toml").exists() and not (run_dir / "progress.json").exists():
        return None
    raw = supervised_status(run_dir)
    if raw is None:
        try:
            spec = load_run_spec(run_dir)
            kind, name = spec.run.kind, spec.run.name
        except SpecError:
            kind, name = "generate", ""
        raw = encoder.encode(from_disk(run_dir, kind, name))
    return raw


def cmd_status(args: argparse.Namespace) -> int:
    """The snapshot from the live supervisor, or from the run directory when none runs."""
    from agents.rundir.gpugroups import label as gpu_label
    from agents.rundir.schema import snapshot_decoder

    run_dir = args.run_dir.resolve()
    raw = status_bytes(run_dir)
    if raw is None:
        print(f"fleetdeck-agent status: {run_dir}: not a run directory", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(raw.decode() + "\n")
        return EXIT_OK
    snap = snapshot_decoder.decode(raw)
    print(f"{snap.run}: {snap.status} ({snap.source}; {snap.host}:{snap.run_dir})")
    p = snap.progress
    if p is not None:
        age = time.time() - p.updated_at
        eta = f"{p.eta_hours:.2f} h" if p.eta_hours is not None else "unknown"
        print(f"  {p.completed}/{p.total} done, {p.failed} failed, {p.rate_per_sec:.2f}/s, "
              f"ETA {eta}  (progress {age:.0f} s old)")
        print(f"  tokens out {p.total_output_tokens} (avg {p.avg_output_tokens}), truncated "
              f"{p.truncated}, empty {p.empty}, max_tokens {p.max_tokens}, control rev "
              f"{p.control_rev}")
        print(f"  S3 {p.s3_uploaded} uploaded ({p.s3_bytes} bytes), {p.s3_pending} pending"
              + (f" - {p.s3_error}" if p.s3_error else ""))
    for s in snap.servers:
        acc = f"{s.accept_length:.2f}" if s.accept_length is not None else "-"
        group = s.gpu_group
        on = f" (GPU {gpu_label(group)})" if group else ""
        print(f"  server {s.number}{on} {s.state:10} {s.in_flight}/{s.limit} in flight, "
              f"{s.completed} done, {s.failed} failed, {s.req_per_s:.2f} req/s, "
              f"{s.tok_per_s:.0f} tok/s, accept {acc}, restarts {s.restarts}")
    for a in snap.alerts:
        since = time.strftime("%H:%M:%S", time.localtime(a.since))
        print(f"  ALERT {a.severity}: {a.message} (since {since})")
    if snap.message:
        print(f"  note: {snap.message}")
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


def cmd_failures(args: argparse.Namespace) -> int:
    """The `failures` RPC's summary, read here to the end of the journal."""
    from agents.rundir.failsummary import FailureSummarizer

    reader = FailureSummarizer(args.run_dir.resolve())
    try:
        summary = reader.summary()
        while not summary.complete:
            summary = reader.summary()
    except OSError as exc:
        print(f"fleetdeck-agent failures: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(msgspec.to_builtins(summary)))
        return EXIT_OK
    print(f"{summary.events} events in {len(summary.groups)} classes, {summary.other} in "
          f"further classes, {summary.retries} retry requests, {summary.unreadable} "
          f"unreadable lines")
    for g in summary.groups:
        when = [time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t)) for t in (g.first, g.last)]
        servers = ", ".join(f"{s.server}: {s.count}" for s in g.servers) or "-"
        print(f"{g.event} {g.error}: {g.count}, first {when[0]}, last {when[1]}, "
              f"servers {servers}")
        if g.examples:
            print(f"  line {g.examples[-1].line}: {g.examples[-1].text!r}")
    return EXIT_OK


def cmd_manifest(args: argparse.Namespace) -> int:
    from agents.artifacts.manifest import Manifest
    from agents.rundir.browse import OutsideRunDir

    if not args.run_dir.is_dir():
        return usage_error("manifest", ValueError(f"{args.run_dir}: no such directory"))
    try:
        entries = Manifest(args.run_dir.resolve()).entries(args.prefix)
    except OutsideRunDir as exc:
        return usage_error("manifest", exc)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode({"entries": entries, "total": len(entries)})
                                + b"\n")
        return EXIT_OK
    for e in entries:
        flags = " ".join(f for f in (("in_s3" if e.in_s3 else ""),
                                     (f"refused:{e.refused}" if e.refused else "")) if f)
        # A file name is the node's to choose: escape controls (a name holding ESC [2J
        # would clear the terminal this is printed on); --json carries the exact bytes.
        name = e.path if e.path.isprintable() else e.path.encode("unicode_escape").decode()
        print(f"{e.kind:<10} {e.size:>12} {(e.sha256 or '-')[:16]:<16} {name}"
              + (f"  [{flags}]" if flags else ""))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from agents.artifacts.verify import VerifyError, verify_run

    try:
        report = verify_run(args.run_dir.resolve())
    except VerifyError as exc:
        return usage_error("verify", exc)
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


def cmd_queue(args: argparse.Namespace) -> int:
    """`queue status|verify|retry|give-back RUN_DIR`: the campaign's queue as this node sees
    it (exit 1 when verify fails or a give-back is refused)."""
    from agents.queue import node
    from agents.queue.retry import RetryRefused

    run_dir = args.run_dir.resolve()
    try:
        if args.what == "status":
            out: Any = node.status(run_dir)
        elif args.what == "verify":
            out = node.verify_report(run_dir, args.deep)
        elif args.what == "retry":
            out = node.retry(run_dir, args.retry, args.max_tokens, "fleetdeck-agent")
        else:
            out = node.give_back(run_dir)
    except (node.NotAQueueRun, RetryRefused, ValueError) as exc:
        return usage_error(f"queue {args.what}", exc) if args.what != "give-back" else \
            _refused(exc)
    if args.json or args.what == "status":
        sys.stdout.buffer.write(msgspec.json.encode(out) + b"\n")
    else:
        print(out.get("summary") or out)
        for p in out.get("problems", [])[:50]:
            print(f"  - {p}")
    return EXIT_CHECK if args.what == "verify" and not out.get("ok") else EXIT_OK


def _refused(exc: Exception) -> int:
    print(f"fleetdeck-agent queue give-back: {exc}", file=sys.stderr)
    return EXIT_CHECK


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


