"""Semantic tones (good, warn, bad, muted, accent) as Rich styles of the current theme, and
the tone of each run status and server state: a state reads at a glance at 3 a.m."""

from __future__ import annotations

from rich.text import Text
from textual.theme import Theme

from console.linkstate import LinkState

RUN_TONE = {"running": "good", "paused": "warn", "draining": "warn", "failed": "bad",
            "done": "accent", "stopped": "muted", "starting": "accent", "unknown": "muted"}
SERVER_TONE = {"healthy": "good", "degraded": "warn", "down": "bad", "starting": "accent",
               "restarting": "accent"}
LINK_TONE: dict[LinkState, str] = {
    "connected": "good", "connecting": "accent", "reconnecting": "warn", "unreachable": "bad",
    "host key": "bad", "version mismatch": "bad"}


def style(theme: Theme, tone: str | None) -> str:
    if tone == "good":
        return theme.success or "green"
    if tone == "warn":
        return theme.warning or "yellow"
    if tone == "bad":
        return f"bold {theme.error or 'red'}"
    if tone == "accent":
        return theme.accent or "cyan"
    if tone == "muted":
        return "dim italic"
    return ""


def toned(text: str, theme: Theme, tone: str | None) -> Text:
    return Text(text, style=style(theme, tone))
