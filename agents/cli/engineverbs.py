"""Headless verbs of the engine: `generate RUN.toml`, and the live controls that write
control.json (`resize`, `max-tokens`, `pause`, `unpause`, `retry`) and `status`."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

from agents.rundir.control import ControlError, update_control
from agents.rundir.schema import Control

EXIT_OK, EXIT_CHECK, EXIT_USAGE = 0, 1, 2


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("generate", help="run the generation engine in the foreground")
    p.add_argument("spec", type=Path, metavar="RUN.toml")
    p.set_defaults(handler=cmd_generate)

    p = sub.add_parser("resize", help="set concurrency for all servers or one (--server N)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("value", type=_positive, metavar="VALUE")
    p.add_argument("--server", type=int, default=None, metavar="N")
    p.set_defaults(handler=cmd_resize)

    p = sub.add_parser("max-tokens", help="max tokens for new requests")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("value", type=_positive, metavar="VALUE")
    p.set_defaults(handler=cmd_max_tokens)

    for verb, paused in (("pause", True), ("unpause", False)):
        p = sub.add_parser(verb, help=f"{verb} sending new requests")
        p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
        p.set_defaults(handler=cmd_pause, paused=paused, verb=verb)

    p = sub.add_parser("retry", help="re-queue failed indices, or truncated ones after a "
                       "max-tokens raise")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("what", choices=["failed", "truncated"])
    p.set_defaults(handler=cmd_retry)

    p = sub.add_parser("status", help="the run's progress, from its run directory")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="the snapshot as JSON on stdout")
    p.set_defaults(handler=cmd_status)


def _control(args: argparse.Namespace, method: str, params: dict[str, Any],
             change: Any) -> int:
    try:
        c: Control = update_control(args.run_dir, method, params, change)
    except ControlError as exc:
        print(f"fleetdeck-agent {method}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{method}: control rev {c.rev} written to {args.run_dir / 'control.json'}; "
          "the engine applies it within 2 s", file=sys.stderr)
    return EXIT_OK


def _max_concurrency(run_dir: Path) -> int | None:
    """The cap the run was launched with (the engine's connection pools are sized to it)."""
    from agents.rundir.spec import SpecError, load_run_spec

    try:
        spec = load_run_spec(run_dir)
    except SpecError:
        return None
    return spec.generate.max_concurrency if spec.generate else None


def cmd_resize(args: argparse.Namespace) -> int:
    cap = _max_concurrency(args.run_dir)
    if cap is not None and args.value > cap:
        print(f"fleetdeck-agent resize: {args.value} is above [generate] max_concurrency {cap} "
              f"in {args.run_dir / 'run.toml'}", file=sys.stderr)
        return EXIT_USAGE

    def change(c: Control) -> None:
        if args.server is None:
            c.concurrency.default = args.value
            c.concurrency.servers.clear()
        else:
            c.concurrency.servers[str(args.server)] = args.value

    return _control(args, "resize", {"value": args.value, "server": args.server}, change)


def cmd_max_tokens(args: argparse.Namespace) -> int:
    if args.value < 1:
        print("fleetdeck-agent max-tokens: VALUE must be at least 1", file=sys.stderr)
        return EXIT_USAGE

    def change(c: Control) -> None:
        c.max_tokens = args.value

    return _control(args, "max_tokens", {"value": args.value}, change)


def cmd_pause(args: argparse.Namespace) -> int:
    def change(c: Control) -> None:
        c.paused = args.paused

    return _control(args, args.verb, {}, change)


def cmd_retry(args: argparse.Namespace) -> int:
    def change(c: Control) -> None:
        setattr(c.retry, args.what, getattr(c.retry, args.what) + 1)

    return _control(args, "retry", {"what": args.what}, change)


def cmd_status(args: argparse.Namespace) -> int:
    """The snapshot from the live supervisor, or from the run directory when none runs."""
    from agents.cli.runverbs import supervised_status
    from agents.rundir.schema import encoder, snapshot_decoder
    from agents.rundir.spec import SpecError, load_run_spec
    from agents.supervise.snapshot import from_disk

    run_dir = args.run_dir.resolve()
    if not (run_dir / "run.toml").exists() and not (run_dir / "progress.json").exists():
        print(f"fleetdeck-agent status: {run_dir}: not a run directory", file=sys.stderr)
        return EXIT_USAGE
    raw = supervised_status(run_dir)
    if raw is None:
        try:
            spec = load_run_spec(run_dir)
            kind, name = spec.run.kind, spec.run.name
        except SpecError:
            kind, name = "generate", ""
        raw = encoder.encode(from_disk(run_dir, kind, name))
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
        print(f"  server {s.number} {s.state:10} {s.in_flight}/{s.limit} in flight, "
              f"{s.completed} done, {s.failed} failed, {s.req_per_s:.2f} req/s, "
              f"{s.tok_per_s:.0f} tok/s, accept {acc}, restarts {s.restarts}")
    for a in snap.alerts:
        since = time.strftime("%H:%M:%S", time.localtime(a.since))
        print(f"  ALERT {a.severity}: {a.message} (since {since})")
    if snap.message:
        print(f"  note: {snap.message}")
    return EXIT_OK


def cmd_generate(args: argparse.Namespace) -> int:
    from agents.engine.run import EngineError, run_engine
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
        return run_engine(spec)
    except (SpecError, EngineError, S3Unavailable, StoreError) as exc:
        print(f"fleetdeck-agent generate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"fleetdeck-agent generate: {exc.filename or ''}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_USAGE


__all__ = ["add_parsers"]
