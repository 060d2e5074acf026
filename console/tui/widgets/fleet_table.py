"""The fleet view's table: a row per node (role, run, status, progress, rate, ETA with its
p10-p90 band, failures, alerts, contact). Only cells that changed are redrawn, so a 32-node
fleet stays cheap."""

from __future__ import annotations

from rich.text import Text
from textual.theme import Theme

from console.sanitize import shown
from console.state import FleetState, NodeState
from console.tui.widgets import figures as f
from console.tui.widgets.live_table import LiveTable, Row
from console.tui.widgets.tones import LINK_TONE, RUN_TONE, style, toned

FLEET_COLUMNS = (("node", "Node", None), ("role", "Role", 8), ("run", "Run", 20),
                 ("status", "Status", 14), ("progress", "Progress", 21), ("rate", "Rate", 12),
                 ("eta", "ETA (p10–p90)", 14), ("failed", "Failed", 15), ("alerts", "Alerts", 6),
                 ("contact", "Contact", 24))
STALE_S = 5.0  # older than this, a node's figures are drawn dim: they are not live


def contact(ns: NodeState, now: float, theme: Theme) -> Text:
    """The link's state and the age of the last snapshot: `1 s`, `reconnecting 12 s`."""
    age = ns.age_s(now)
    if ns.link == "connected":
        text = f.age(age) if age is not None else "connected"
        return toned(text, theme, "warn" if age is not None and age > STALE_S else None)
    text = ns.link if age is None else f"{ns.link} {f.age(age)}"
    return toned(text, theme, LINK_TONE.get(ns.link, "bad"))


def fleet_row(ns: NodeState, now: float, theme: Theme) -> Row:
    snap = ns.snapshot
    age = ns.age_s(now)
    stale = ns.link != "connected" or age is None or age > STALE_S
    dim = style(theme, "muted") if stale else ""
    name = Text(ns.name, style="bold")
    role = ns.node.role
    if snap is None:
        blank = Text(f.DASH, style="dim")
        return (name, role, blank, blank, blank, blank, blank, blank, blank,
                contact(ns, now, theme))
    status = snap.status + (" (disk)" if snap.source == "disk" else "")
    status_cell = Text(status, style=dim or style(theme, RUN_TONE.get(snap.status)))
    progress = rate = eta = failed = f.DASH
    p = snap.progress
    if p is not None:
        progress = f"{f.pct(p.completed, p.total)} {f.si(p.completed)}/{f.si(p.total)}"
        rate = f.rate(p.rate_per_sec, "/s", 2 if p.rate_per_sec < 10 else 1)
        eta = f.eta_compact(p.eta_hours, p.eta_p10_hours, p.eta_p90_hours)
        failed = f"{f.num(p.failed)} ({f.pct(p.failed, p.completed + p.failed, 2)})" \
            if p.failed else "0"
    elif snap.train is not None:
        t = snap.train
        progress = f"{f.pct(t.step, t.total_steps)} {f.num(t.step)}/{f.num(t.total_steps)}"
        rate = f.rate(t.tokens_per_s, " tok/s")
        eta = f.hours(t.eta_hours)
    crit = any(a.severity == "critical" for a in snap.alerts)
    alerts = Text(str(len(snap.alerts)), style=style(theme, "bad" if crit else "warn")) \
        if snap.alerts else Text("0", style="dim")
    return (name, role, Text(shown(snap.run), style=dim), status_cell, Text(progress, style=dim),
            Text(rate, style=dim), Text(eta, style=dim), Text(failed, style=dim), alerts,
            contact(ns, now, theme))


class FleetTable(LiveTable):
    COLUMNS = FLEET_COLUMNS

    def show(self, state: FleetState, now: float, theme: Theme) -> None:
        self.sync({name: fleet_row(ns, now, theme) for name, ns in state.nodes.items()})

    @property
    def selected_node(self) -> str | None:
        return self.selected_key
