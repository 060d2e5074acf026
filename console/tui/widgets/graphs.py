"""Sparklines of a node's recent past: output tokens/s, accept length, new failures per step."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from console.tui.history import NodeHistory
from console.tui.widgets import figures as f

GRAPHS = (("throughput", "tok/s"), ("accept", "accept"), ("failures", "failed/step"))


class HistoryGraphs(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._drawn = -1

    def compose(self) -> ComposeResult:
        for key, label in GRAPHS:
            with Horizontal(classes="graph-row"):
                yield Label(label, classes="graph-label")
                yield Sparkline([], id=f"spark-{key}", classes="graph")
                yield Label(f.DASH, id=f"last-{key}", classes="graph-last")

    def show(self, history: NodeHistory) -> None:
        if history.version == self._drawn:
            return
        self._drawn = history.version
        series = {"throughput": history.throughput(), "accept": history.accept_length(),
                  "failures": history.failures()}
        for key, data in series.items():
            self.query_one(f"#spark-{key}", Sparkline).data = data
            last = data[-1] if data else None
            text = f.DASH if last is None else (f"{last:.2f}" if key == "accept"
                                                 else f.si(last))
            self.query_one(f"#last-{key}", Label).update(text)
