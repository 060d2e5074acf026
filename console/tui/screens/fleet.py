"""The fleet view: a row per campaign above its nodes, a row per node, and every node's alerts;
enter opens a node or a campaign's shards. The bar gives the fleet's total rate, when its last
node should finish (with the band) and what it costs."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Footer, Label

from agents.rundir.schema import Alert
from console.state import NodeState
from console.tui.screens.base import View, ViewContext
from console.tui.widgets import figures as f
from console.tui.widgets.alert_list import AlertList
from console.tui.widgets.fleet_table import FleetTable
from console.tui.widgets.keys import key_for
from console.tui.widgets.live_static import LiveStatic
from console.tui.widgets.tones import style


def fleet_figures(nodes: list[NodeState]) -> Text:
    """` · 14.4 req/s, 15.6k tok/s in all · last ETA 8.9 h (7.8 h–10.4 h) gen-1 · $1,234 so
    far`: what every node's run adds up to, and the ETA of the one that finishes last."""
    text = Text()
    runs = [(n, n.snapshot.progress) for n in nodes
            if n.snapshot is not None and n.snapshot.progress is not None]
    live = [(n, p) for n, p in runs if p.status in ("running", "paused", "draining")]
    req = sum(p.rate_per_sec for _, p in live)
    tok = sum(sp.tok_per_s for _, p in live for sp in p.servers.values())
    text.append(f" · {f.rate(req, ' req/s', 2)}, {f.rate(tok, ' tok/s')} in all")
    last = max(live, key=lambda np: np[1].eta_hours if np[1].eta_hours is not None
               else float("inf"), default=None)
    if last is not None:
        node, p = last
        status = "" if p.status == "running" else f", {p.status}"
        text.append(f" · last ETA {f.eta(p.eta_hours, p.eta_p10_hours, p.eta_p90_hours)} "
                    f"({node.name}{status})")
    costs = [c for n, p in runs if (c := n.node.run_cost(p)) is not None]
    if costs:
        text.append(f" · {f.usd(sum(c.usd for c in costs))} so far")
    return text


class FleetScreen(View):
    class OpenNode(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    class OpenCampaign(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def compose(self) -> ComposeResult:
        yield LiveStatic(id="fleet-bar", classes="bar")
        yield FleetTable(id="fleet-table")
        yield Label("Alerts", classes="pane-title")
        yield AlertList(id="fleet-alerts")
        yield Footer(compact=True)

    @property
    def selected_node(self) -> str | None:
        return self.query_one(FleetTable).selected_node

    @property
    def selected_campaign(self) -> str | None:
        return self.query_one(FleetTable).selected_campaign

    def show(self, ctx: ViewContext) -> None:
        nodes = ctx.state.nodes.values()
        bar = Text()
        bar.append(" fleetdeck ", style="bold reverse")
        live = sum(1 for n in nodes if n.link == "connected")
        bar.append(f"  {len(ctx.state.nodes)} nodes · {live} connected")
        bar.append(fleet_figures(list(nodes)))
        alerts: list[tuple[str, Alert]] = [(n.name, a) for n in nodes
                                           if n.snapshot is not None for a in n.snapshot.alerts]
        if alerts:
            bar.append(f" · {len(alerts)} alert{'s' if len(alerts) > 1 else ''}",
                       style=style(ctx.theme, "bad"))
        if ctx.read_only:
            bar.append("   READ-ONLY", style=style(ctx.theme, "warn") + " bold")
        self.query_one("#fleet-bar", LiveStatic).draw(bar)
        self.query_one(FleetTable).show(ctx.state, ctx.now, ctx.theme)
        self.query_one(AlertList).show(alerts, ctx.now, ctx.theme,
                                       lambda action: key_for(self, action))

    def forget(self) -> None:
        self.query_one(FleetTable).forget()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value
        if key is None:
            return
        if self.query_one(FleetTable).selected_campaign == key:
            self.post_message(self.OpenCampaign(str(key)))
        else:
            self.post_message(self.OpenNode(str(key)))
