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
    """Whole seconds, rounded down: a rounded age flipped between `0 s` and `1 s` on every
    redraw of a node reporting each second, redrawing its row for nothing."""
    if seconds is None:
        return DASH
    if seconds < 90:
        return f"{int(seconds)} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def rate(value: float | None, unit: str = "/s", digits: int = 1) -> str:
    if value is None:
        return DASH
    return f"{si(value, digits)}{unit}"


def eta(h: float | None, p10: float | None, p90: float | None) -> str:
    """An ETA with its p10-p90 band when known: `8.9 h (7.8 h–10.4 h)`; `?` for an open end
    (the slow end is unknown while the recent rate includes a stop)."""
    if h is None:
        return DASH
    text = hours(h)
    if p10 is not None and h != 0:
        text += f" ({hours(p10)}–{hours(p90) if p90 is not None else '?'})"
    return text


def usd(value: float | None) -> str:
    """Money: `$12.34`, `$1,234`, `$12.3k` above ten thousand."""
    if value is None:
        return DASH
    if abs(value) >= 10_000:
        return f"${value / 1000:,.1f}k"
    if abs(value) >= 1000:
        return f"${value:,.0f}"
    return f"${value:,.2f}"


def eta_compact(h: float | None, p10: float | None, p90: float | None) -> str:
    """An ETA and its band in one unit, for a table cell: `8.9 h 7.8–10`, `17 min 12–25`."""
    if h is None or p10 is None or h == 0:
        return hours(h)
    if h < 1:
        scale, unit = 60.0, "min"
        central = f"{h * scale:.0f}"
    elif h < 48:
        scale, unit = 1.0, "h"
        central = f"{h:.1f}"
    else:
        scale, unit = 1 / 24, "d"
        central = f"{h * scale:.1f}"

    def end(v: float | None) -> str:
        if v is None:
            return "?"
        x = v * scale
        return f"{x:.0f}" if x >= 10 or unit == "min" else f"{x:.1f}"

    return f"{central} {unit} {end(p10)}–{end(p90)}"
