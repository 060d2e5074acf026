"""A campaign's shards, a row each: the node, its shard, its run's status and figures, and
its contact, all from the roll-up (console/campaign.py) and the node's state."""

from __future__ import annotations

from rich.text import Text
from textual.theme import Theme

from console.campaign import Rollup
from console.sanitize import shown
from console.state import FleetState
from console.tui.widgets import figures as f
from console.tui.widgets.fleet_table import STALE_S, contact
from console.tui.widgets.live_table import LiveTable, Row
from console.tui.widgets.tones import RUN_TONE, style

SHARD_COLUMNS = (("node", "Node", None), ("shard", "Shard", 7), ("status", "Status", 14),
                 ("progress", "Progress", 21), ("rate", "Rate", 10),
                 ("eta", "ETA (p10–p90)", 14), ("failed", "Failed", 9),
                 ("truncated", "Truncated", 10), ("alerts", "Alerts", 6),
                 ("contact", "Contact", 24))


class ShardTable(LiveTable):
    COLUMNS = SHARD_COLUMNS

    def show(self, r: Rollup, state: FleetState, now: float, theme: Theme) -> None:
        rows: dict[str, Row] = {}
        for s in r.shards:
            ns = state.nodes[s.node]
            age = ns.age_s(now)
            stale = ns.link != "connected" or age is None or age > STALE_S
            dim = style(theme, "muted") if stale else ""
            shard = s.shard
            if s.running_shard is not None and s.running_shard != s.shard:
                shard = f"{s.shard}≠{shown(s.running_shard)}"
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
            rows[s.node] = (Text(s.node, style="bold"), shard, status,
                            Text(progress, style=dim), Text(rate, style=dim),
                            Text(eta, style=dim), Text(failed, style=dim),
                            Text(truncated, style=dim), alerts, contact(ns, now, theme))
        self.sync(rows)

    @property
    def selected_node(self) -> str | None:
        return self.selected_key
