"""`fleetdeck-train`: data preparation and DFlash drafter training (the Trainer issue)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agents import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fleetdeck-train",
        description="fleetdeck trainer: prepare and train arrive with the Trainer issue; "
        "no command is available in this version.",
    )
    parser.add_argument("--version", action="version", version=f"fleetdeck-train {__version__}")
    parser.parse_args(argv)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
