"""A node's screens. Generation: run panel, sparklines, the per-GPU table, and tabs for
alerts, the log tail and the latest completions. Training: the trainer's figures, GPU stats,
alerts and the log tail."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Footer, TabbedContent, TabPane

from agents.rundir.schema import Snapshot
from console.tui.fetched import Fetched
from console.tui.palette import ScreenCommands
from console.tui.screens.base import View, ViewContext, node_bar
from console.tui.widgets.alert_list import AlertList
from console.tui.widgets.gpu_table import GpuTable
from console.tui.widgets.graphs import HistoryGraphs
from console.tui.widgets.keys import key_for
from console.tui.widgets.live_static import LiveStatic
from console.tui.widgets.log_pane import LogPane
from console.tui.widgets.run_panel import RunPanel
from console.tui.widgets.samples_pane import SamplesPane
from console.tui.widgets.train_panel import TrainGpuTable, TrainPanel, gpu_rows

STALE_S = 5.0


class NodeView(View):
    def __init__(self, node_name: str) -> None:
        super().__init__(name=node_name)
        self.node_name = node_name
        self.snapshot: Snapshot | None = None  # the one drawn last
        self._alerts_label = "Alerts"
        self._fetched_drawn = -1

    def show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    @property
    def active_tab(self) -> str:
        """The tab shown; "" while the screen's widgets are not there (mounted, not yet
        composed, or being torn down: the app's tick asks at any moment)."""
        found = self.query(TabbedContent)
        return found.first().active if found else ""

    @property
    def log_pane(self) -> LogPane:
        return self.query_one(LogPane)

    def _show_fetched(self, fetched: Fetched) -> None:
        if fetched.version == self._fetched_drawn:
            return
        self._fetched_drawn = fetched.version
        self.query_one(LogPane).show(fetched.log)
        if fetched.samples is not None and self.query(SamplesPane):
            self.query_one(SamplesPane).show(fetched.samples)


class GenerateScreen(NodeView):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("h", "history_span", "Sparklines: 1 h, 6 h, the whole run", show=False,
                id="node_history_span",
                tooltip="cycle the span the sparklines show; the node serves it downsampled"),
    ]
    COMMANDS: ClassVar = {ScreenCommands}

    class CycleHistorySpan(Message):
        """The sparklines' span is to change: the app fetches the node's history again."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def action_history_span(self) -> None:
        assert self.node_name is not None
        self.post_message(self.CycleHistorySpan(self.node_name))

    def compose(self) -> ComposeResult:
        yield LiveStatic(id="node-bar", classes="bar")
        with Horizontal(id="node-top"):
            yield RunPanel(id="run-panel")
            yield HistoryGraphs(id="graphs")
        yield GpuTable(id="gpu-table")
        with TabbedContent(id="node-tabs", initial="tab-alerts"):
            with TabPane("Alerts", id="tab-alerts"):
                yield AlertList(id="node-alerts")
            with TabPane("Log", id="tab-log"):
                yield LogPane(key_for(self, "logs"), id="log-pane")
            with TabPane("Samples", id="tab-samples"):
                yield SamplesPane(key_for(self, "samples"), id="samples-pane")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(GpuTable).focus()

    @property
    def gpu_table(self) -> GpuTable:
        return self.query_one(GpuTable)

    def selected_server(self) -> tuple[int, list[int] | None] | None:
        """(server number, its GPUs) of the GPU table's cursor row."""
        number = self.gpu_table.selected_server
        if number is None:
            return None
        group = None
        if self.snapshot is not None:
            group = next((s.gpu_group for s in self.snapshot.servers if s.number == number),
                         None)
        return number, group

    def show(self, ctx: ViewContext) -> None:
        assert self.node_name is not None
        ns = ctx.state.nodes[self.node_name]
        snap = ns.snapshot
        self.snapshot = snap
        age = ns.age_s(ctx.now)
        stale = ns.link != "connected" or age is None or age > STALE_S
        self.query_one("#node-bar", LiveStatic).draw(node_bar(ns, ctx))
        self.query_one(RunPanel).show(snap, ctx.theme, age, ns.link, ns.error,
                                      ns.node.cost_per_gpu_hour,
                                      ns.node.run_cost(snap.progress if snap else None))
        self.gpu_table.show(snap, ctx.theme, stale)
        fetched = ctx.fetched[self.node_name]
        self.query_one(HistoryGraphs).show(fetched.history)
        alerts = [("", a) for a in snap.alerts] if snap is not None else []
        self.query_one(AlertList).show(alerts, ctx.now, ctx.theme,
                                       lambda action: key_for(self, action))
        label = f"Alerts ({len(alerts)})" if alerts else "Alerts"
        if label != self._alerts_label:  # a tab's label lays the screen out again
            self._alerts_label = label
            self.query_one(TabbedContent).get_tab("tab-alerts").label = label
        self._show_fetched(fetched)

    def forget(self) -> None:
        self.gpu_table.forget()


class TrainScreen(NodeView):
    def compose(self) -> ComposeResult:
        yield LiveStatic(id="node-bar", classes="bar")
        yield TrainPanel(id="train-panel")
        yield TrainGpuTable(id="train-gpus")
        with TabbedContent(id="node-tabs", initial="tab-alerts"):
            with TabPane("Alerts", id="tab-alerts"):
                yield AlertList(id="node-alerts")
            with TabPane("Log", id="tab-log"):
                yield LogPane(key_for(self, "logs"), id="log-pane")
        yield Footer(compact=True)

    def show(self, ctx: ViewContext) -> None:
        assert self.node_name is not None
        ns = ctx.state.nodes[self.node_name]
        snap = self.snapshot = ns.snapshot
        age = ns.age_s(ctx.now)
        stale = ns.link != "connected" or age is None or age > STALE_S
        self.query_one("#node-bar", LiveStatic).draw(node_bar(ns, ctx))
        self.query_one(TrainPanel).show(snap, ctx.theme, age, ns.link, ns.error)
        table = self.query_one(TrainGpuTable)
        rows = gpu_rows(snap, stale) if snap is not None else {}
        table.sync(rows)
        table.display = bool(rows)
        alerts = [("", a) for a in snap.alerts] if snap is not None else []
        self.query_one(AlertList).show(alerts, ctx.now, ctx.theme)
        self._show_fetched(ctx.fetched[self.node_name])

    def forget(self) -> None:
        self.query_one(TrainGpuTable).forget()
