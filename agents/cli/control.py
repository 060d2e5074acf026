"""Verbs that change a live run through control.json: `resize` (a number, or `auto`),
`max-tokens`, `pause`, `unpause` and `retry`. The engine applies a change within 2 s."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agents.cli.exits import EXIT_OK, EXIT_USAGE, non_negative
from agents.rundir.control import (
    ControlError,
    parse_resize_value,
    resize,
    resize_refusal,
    update_control,
)
from agents.rundir.schema import Control


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("resize", help="set concurrency for all servers or one (--server N); "
                       "VALUE \"auto\" lets each server find its best level")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("value", type=_resize_value, metavar="VALUE")
    p.add_argument("--server", type=int, default=None, metavar="N")
    p.set_defaults(handler=cmd_resize)

    p = sub.add_parser("max-tokens", help="max tokens for new requests")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("value", type=non_negative, metavar="VALUE")
    p.set_defaults(handler=cmd_max_tokens)

    for verb, paused in (("pause", True), ("unpause", False)):
        p = sub.add_parser(verb, help=f"{verb} sending new requests")
        p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
        p.set_defaults(handler=cmd_pause, paused=paused, verb=verb)

    p = sub.add_parser("retry", help="re-queue failed indices, or truncated ones after a "
                       "max-tokens raise")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("what", choices=["failed", "truncated"])
    p.add_argument("--long-only", action="store_true",
                   help="truncated: only the long answers, not those cut in a repetition loop")
    p.set_defaults(handler=cmd_retry)


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


def _resize_value(text: str) -> int | str:
    try:
        return parse_resize_value(text)
    except ControlError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("resize: ")) from None


def cmd_resize(args: argparse.Namespace) -> int:
    refusal = resize_refusal(args.run_dir, args.value, args.server)
    if refusal is not None:
        print(f"fleetdeck-agent resize: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    cap = _max_concurrency(args.run_dir)
    if cap is not None and isinstance(args.value, int) and args.value > cap:
        print(f"fleetdeck-agent resize: {args.value} is above [generate] max_concurrency {cap} "
              f"in {args.run_dir / 'run.toml'}", file=sys.stderr)
        return EXIT_USAGE

    def change(c: Control) -> None:
        resize(c, args.value, args.server)

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
    if args.long_only and args.what != "truncated":
        print("retry: --long-only goes with truncated only", file=sys.stderr)
        return 2
    what = "long" if args.long_only else args.what  # long: truncated, loops left out

    def change(c: Control) -> None:
        setattr(c.retry, what, getattr(c.retry, what) + 1)

    return _control(args, "retry", {"what": args.what, "long_only": args.long_only}, change)
