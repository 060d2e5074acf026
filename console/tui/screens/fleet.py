"""The fleet view: a row per campaign above its nodes, a row per node, and every node's alerts;
enter opens a node or a campaign's shards. The bar gives the fleet's total rate, when its last
node should finish (with the band) and what it costs, and how many nodes the filter shows.
The table sorts by a column (`o` cycles it, `O` reverses, or a click on its header) and
filters by name, state or alert (`/`; escape shows every node again)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable, Footer, Input, Label

from agents.rundir.schema import Alert
from console.state import NodeState
from console.tui.palette import ScreenCommands
from console.tui.screens.base import View, ViewContext
from console.tui.widgets import figures as f
from console.tui.widgets.alert_list import AlertList
from console.tui.widgets.fleet_order import SORTABLE, Order
from console.tui.widgets.fleet_table import FLEET_COLUMNS, FleetTable
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


LABELS = {key: label for key, label, _width in FLEET_COLUMNS}


def order_line(order: Order, shown: int, total: int) -> str:
    """` · 12 of 128 shown, filter: oom · sorted by Rate ↓`; "" when neither is set."""
    line = ""
    if order.filter:
        line += f" · {shown} of {total} shown, filter: {order.filter}"
    if order.column is not None:
        line += f" · sorted by {LABELS[order.column]} {'↓' if order.reverse else '↑'}"
    return line


class FleetScreen(View):
    # Out of the footer (it is full): in the palette, the README's keys table and the keymap.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "sort", "Sort the fleet by the next column", show=False, id="fleet_sort",
                tooltip="node, role, run, status, progress, rate, ETA, failed, alerts, "
                        "contact, then the fleet file's order"),
        Binding("O", "sort_reverse", "Reverse the fleet's sort", show=False,
                id="fleet_sort_reverse"),
        Binding("slash", "filter", "Filter the fleet", show=False, id="fleet_filter",
                tooltip="by a node's name, state or alert"),
        Binding("escape", "filter_clear", "Show every node", show=False,
                id="fleet_filter_clear", tooltip="clear the fleet's filter"),
    ]
    COMMANDS: ClassVar = {ScreenCommands}

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
        yield Input(placeholder="filter: name, state or alert (escape: all nodes)",
                    id="fleet-filter")
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
        self._ctx = ctx
        table = self.query_one(FleetTable)
        table.show(ctx.state, ctx.now, ctx.theme)
        nodes = ctx.state.nodes.values()
        bar = Text()
        bar.append(" fleetdeck ", style="bold reverse")
        live = sum(1 for n in nodes if n.link == "connected")
        bar.append(f"  {len(ctx.state.nodes)} nodes · {live} connected")
        # The filter and sort before the figures: a narrow terminal cuts the line's end, and
        # a filter hiding nodes must never be cut.
        bar.append(order_line(table.order, table.shown, len(ctx.state.nodes)))
        bar.append(fleet_figures(list(nodes)))
        alerts: list[tuple[str, Alert]] = [(n.name, a) for n in nodes
                                           if n.snapshot is not None for a in n.snapshot.alerts]
        if alerts:
            bar.append(f" · {len(alerts)} alert{'s' if len(alerts) > 1 else ''}",
                       style=style(ctx.theme, "bad"))
        if ctx.read_only:
            bar.append("   READ-ONLY", style=style(ctx.theme, "warn") + " bold")
        self.query_one("#fleet-bar", LiveStatic).draw(bar)
        self.query_one(AlertList).show(alerts, ctx.now, ctx.theme,
                                       lambda action: key_for(self, action))

    def forget(self) -> None:
        self.query_one(FleetTable).forget()

    # -- sort and filter: a view, so allowed under --read-only ------------------------------

    def _reorder(self, order: Order) -> None:
        self.query_one(FleetTable).order = order
        ctx = getattr(self, "_ctx", None)
        if ctx is not None:
            self.show(ctx)

    def action_sort(self) -> None:
        self._reorder(self.query_one(FleetTable).order.next_column())

    def action_sort_reverse(self) -> None:
        self._reorder(self.query_one(FleetTable).order.reversed())

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        column = str(event.column_key.value)
        if column not in SORTABLE:
            return
        order = self.query_one(FleetTable).order
        if order.column == column:
            self._reorder(order.reversed())
        else:
            self._reorder(Order(column, False, order.filter))

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.add_class("open")
        box.focus()

    def action_filter_clear(self) -> None:
        """Escape: close the filter box and show every node; with neither, back to the fleet
        (the app's escape)."""
        box = self.query_one("#fleet-filter", Input)
        table = self.query_one(FleetTable)
        if not box.has_class("open") and not table.order.filter:
            self.app.call_later(self.app.run_action, "do('fleet')")
            return
        box.remove_class("open")
        box.value = ""
        table.focus()
        self._reorder(Order(table.order.column, table.order.reverse, ""))

    @on(Input.Changed, "#fleet-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        order = self.query_one(FleetTable).order
        self._reorder(Order(order.column, order.reverse, event.value.strip()))

    @on(Input.Submitted, "#fleet-filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        """Enter: keep the filter, back to the table (the box stays while it filters)."""
        if not event.value.strip():
            event.input.remove_class("open")
        self.query_one(FleetTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value
        if key is None:
            return
        if self.query_one(FleetTable).selected_campaign == key:
            self.post_message(self.OpenCampaign(str(key)))
        else:
            self.post_message(self.OpenNode(str(key)))
