"""Exit codes and error reporting shared by every `fleetdeck-agent` verb."""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


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
