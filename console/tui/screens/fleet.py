"""The fleet view: a row per node and every node's alerts; enter opens a node."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Footer, Label, Static

from agents.rundir.schema import Alert
from console.tui.screens.base import View, ViewContext
from console.tui.widgets import figures as f
from console.tui.widgets.alert_list import AlertList
from console.tui.widgets.fleet_table import FleetTable
from console.tui.widgets.tones import style


class FleetScreen(View):
    class OpenNode(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-bar", classes="bar")
        yield FleetTable(id="fleet-table")
        yield Label("Alerts", classes="pane-title")
        yield AlertList(id="fleet-alerts")
        yield Footer(compact=True)

    @property
    def selected_node(self) -> str | None:
        return self.query_one(FleetTable).selected_node

    def show(self, ctx: ViewContext) -> None:
        nodes = ctx.state.nodes.values()
        bar = Text()
        bar.append(" fleetdeck ", style="bold reverse")
        live = sum(1 for n in nodes if n.link == "connected")
        bar.append(f"  {len(ctx.state.nodes)} nodes · {live} connected")
        rate = sum(n.snapshot.progress.rate_per_sec for n in nodes
                   if n.snapshot is not None and n.snapshot.progress is not None)
        bar.append(f" · {f.rate(rate, ' req/s', 2)} in all")
        alerts: list[tuple[str, Alert]] = [(n.name, a) for n in nodes
                                           if n.snapshot is not None for a in n.snapshot.alerts]
        if alerts:
            bar.append(f" · {len(alerts)} alert{'s' if len(alerts) > 1 else ''}",
                       style=style(ctx.theme, "bad"))
        if ctx.read_only:
            bar.append("   READ-ONLY", style=style(ctx.theme, "warn") + " bold")
        self.query_one("#fleet-bar", Static).update(bar)
        self.query_one(FleetTable).show(ctx.state, ctx.now, ctx.theme)
        self.query_one(AlertList).show(alerts, ctx.now, ctx.theme)

    def forget(self) -> None:
        self.query_one(FleetTable).forget()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.OpenNode(str(event.row_key.value)))
