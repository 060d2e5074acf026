"""Exit codes and error reporting shared by every `fleetdeck-agent` verb."""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
# `up --wait` only: how the job ended when it did not end done (0).
EXIT_FAILED = 4  # the job failed, or refused to start
EXIT_STOPPED = 5  # stopped before it was done: SIGTERM/SIGINT to `up --wait`, a stop, a down
EXIT_LOST = 6  # the supervisor died (killed, crashed) before the job ended
EXIT_GAVE_UP = 7  # a second SIGTERM/SIGINT: exited without waiting for the drain


def usage_error(verb: str, exc: Exception) -> int:
    print(f"fleetdeck-agent {verb}: {exc}", file=sys.stderr)
    return EXIT_USAGE


def needs_yes(args: argparse.Namespace, verb: str) -> bool:
    if not args.yes:
        print(f"fleetdeck-agent {verb}: a dangerous action; add --yes to confirm",
              file=sys.stderr)
        return False
    return True


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value
