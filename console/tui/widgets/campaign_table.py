"""A campaign's nodes, a row each: the node, its place (the chunks it holds and has committed,
and the lines it wrote that no commit names; a training rank), its run's status and figures
(on a queue campaign its part of the commits' lines), and its contact, all from the roll-up
(console/queue/rollup.py) and the node's state."""

from __future__ import annotations

from rich.text import Text
from textual.theme import Theme

from console.queue.rollup import GIVEN_BACK, Rollup
from console.sanitize import shown
from console.state import FleetState
from console.tui.widgets import figures as f
from console.tui.widgets.fleet_table import STALE_S, contact
from console.tui.widgets.live_table import LiveTable, Row
from console.tui.widgets.tones import RUN_TONE, style

MEMBER_COLUMNS = (("node", "Node", None), ("place", "Chunks", 16), ("status", "Status", 14),
                 ("progress", "Progress", 21), ("rate", "Rate", 10),
                 ("eta", "ETA (p10–p90)", 14), ("failed", "Failed", 9),
                 ("truncated", "Truncated", 10), ("alerts", "Alerts", 6),
                 ("contact", "Contact", 24))


class MemberTable(LiveTable):
    COLUMNS = MEMBER_COLUMNS

    def show(self, r: Rollup, state: FleetState, now: float, theme: Theme) -> None:
        rows: dict[str, Row] = {}
        for s in r.rows:
            ns = state.nodes[s.node]
            age = ns.age_s(now)
            stale = ns.link != "connected" or age is None or age > STALE_S
            dim = style(theme, "muted") if stale else ""
            if s.committed_here is not None:
                place = f"{s.committed_here} done" + (f", on {shown(', '.join(s.held))}"
                                                      if s.held else "")
                if s.lost_lines:  # lines it wrote that no commit names
                    place += f", {f.si(s.lost_lines)} lines lost"
                elif s.lost:
                    place += f", {s.lost} lost"
            else:
                place = s.place if s.place != s.node else f.DASH
            status = Text(f.DASH, style="dim") if s.status is None else \
                Text(shown(s.status), style=dim or style(theme, RUN_TONE.get(s.status)))
            progress = rate = eta = failed = truncated = f.DASH
            if s.total is not None and s.completed is not None:
                progress = f"{f.pct(s.completed, s.total)} {f.si(s.completed)}/{f.si(s.total)}"
                rate = f.rate(s.rate_per_sec, "/s", 2)
                eta = f.eta_compact(s.eta_hours, s.eta_p10_hours, s.eta_p90_hours)
                failed, truncated = f.num(s.failed), f.num(s.truncated)
            alerts = Text(str(s.alerts), style=style(theme, "warn")) if s.alerts \
                else Text("0", style="dim")
            rows[s.node] = (Text(s.node, style="bold"), place, status,
                            Text(progress, style=dim), Text(rate, style=dim),
                            Text(eta, style=dim), Text(failed, style=dim),
                            Text(truncated, style=dim), alerts,
                            contact(ns, now, theme, s.link == GIVEN_BACK))
        self.sync(rows)

    @property
    def selected_node(self) -> str | None:
        return self.selected_key
