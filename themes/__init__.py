"""Textual themes and stylesheets shipped with the console (data files beside this module)."""

from pathlib import Path

THEMES_DIR = Path(__file__).parent


def stylesheet(name: str = "fleetdeck") -> Path:
    """Path of a shipped TCSS stylesheet, e.g. stylesheet() -> themes/fleetdeck.tcss."""
    path = THEMES_DIR / f"{name}.tcss"
    if not path.exists():
        raise FileNotFoundError(f"no stylesheet {name!r} in {THEMES_DIR}")
    return path
