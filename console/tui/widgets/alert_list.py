"""The alerts a node reports now, most severe first, each with how long it has held and the
user's keys for the actions that deal with it (`u pull · k decommission`)."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.theme import Theme

from agents.rundir.schema import Alert
from console.sanitize import shown
from console.tui.widgets import figures as f
from console.tui.widgets.live_static import LiveStatic
from console.tui.widgets.tones import style


def alert_lines(alerts: list[tuple[str, Alert]], now: float, theme: Theme,
                keys: Callable[[str], str] | None = None) -> Text:
    """(node, alert) pairs; the node name is left out where it is empty. `keys`: the key an
    action id is on now (the user's keymap applied)."""
    if not alerts:
        return Text("no alerts", style="dim")
    text = Text()
    order = sorted(alerts, key=lambda na: (na[1].severity != "critical", na[1].since))
    for i, (node, a) in enumerate(order):
        if i:
            text.append("\n")
        tone = "bad" if a.severity == "critical" else "warn"
        text.append(f"{a.severity:<8} ", style=style(theme, tone))
        if node:
            text.append(f"{node} ", style="bold")
        text.append(shown(a.message))
        if a.actions and keys is not None:
            text.append("  ")
            for j, action in enumerate(a.actions):
                text.append(" · " if j else "")
                text.append(keys(action) or "?", style="bold reverse")
                text.append(f" {action}")
        text.append(f"  ({a.code}, for {f.age(max(0.0, now - a.since))})", style="dim")
    return text


class AlertList(LiveStatic):
    def show(self, alerts: list[tuple[str, Alert]], now: float, theme: Theme,
             keys: Callable[[str], str] | None = None) -> None:
        self.draw(alert_lines(alerts, now, theme, keys))
