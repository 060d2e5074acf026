"""How a figure is written on screen: units, thousands, ages; `–` for unknown (never 0)."""

from __future__ import annotations

DASH = "–"


def num(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return DASH
    return f"{value:,.{digits}f}"


def si(value: float | int | None, digits: int = 1) -> str:
    """12345 -> 12.3k; 1.64e9 -> 1.64G."""
    if value is None:
        return DASH
    v = float(value)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.{digits}f}{unit}"
    return f"{v:.0f}" if v == int(v) else f"{v:.{digits}f}"


def size(nbytes: float | int | None) -> str:
    if nbytes is None:
        return DASH
    v = float(nbytes)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(v) < 1000 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1000
    return DASH  # pragma: no cover


def pct(part: float | int | None, whole: float | int | None, digits: int = 1) -> str:
    if part is None or not whole:
        return DASH
    return f"{100.0 * part / whole:.{digits}f}%"


def hours(h: float | None) -> str:
    """An ETA or a duration given in hours: 42 s, 17 min, 3.2 h, 2.1 d."""
    if h is None:
        return DASH
    s = h * 3600
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if h < 48:
        return f"{h:.1f} h"
    return f"{h / 24:.1f} d"


def age(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def rate(value: float | None, unit: str = "/s", digits: int = 1) -> str:
    if value is None:
        return DASH
    return f"{si(value, digits)}{unit}"
