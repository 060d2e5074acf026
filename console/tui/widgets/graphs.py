"""Sparklines of a node's recent past (output tokens/s, accept length, new failures per step),
and the auto-tuner's measured curve of a server: tokens/s against concurrency."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from agents.rundir.schema import TunePoint
from console.tui.history import SPAN_TITLES, SPANS, NodeHistory
from console.tui.widgets import figures as f

BARS = "▁▂▃▄▅▆▇█"

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
        # The last hour is what the sparklines have always shown: titled only when cycled.
        self.border_title = SPAN_TITLES[history.span] if history.span != SPANS[0] else None
        series = {"throughput": history.throughput(), "accept": history.accept_length(),
                  "failures": history.failures()}
        for key, data in series.items():
            self.query_one(f"#spark-{key}", Sparkline).data = data
            last = data[-1] if data else None
            text = f.DASH if last is None else (f"{last:.2f}" if key == "accept"
                                                 else f.si(last))
            self.query_one(f"#last-{key}", Label).update(text)


def knee_plot(curve: list[TunePoint], chosen: int | None, chosen_style: str = "bold",
              width: int = 8) -> Text:
    """Tokens/s against concurrency as measured, one bar per level tried (lowest level on the
    left; bars span the lowest to the highest tokens/s measured), the chosen level's bar in
    `chosen_style`: `▁▃▅▇█▇`."""
    points = sorted(curve, key=lambda p: p.concurrency)
    if len(points) > width:  # keep the chosen level in view, and the levels around it
        at = next((i for i, p in enumerate(points) if p.concurrency == chosen), len(points) - 1)
        start = max(0, min(at - width // 2, len(points) - width))
        points = points[start:start + width]
    low = min((p.tok_per_s for p in points), default=0.0)
    top = max((p.tok_per_s for p in points), default=0.0)
    text = Text()
    for p in points:
        # From the lowest to the highest measured: the shape (where it stops rising) shows.
        step = int((p.tok_per_s - low) / (top - low) * (len(BARS) - 1) + 0.5) \
            if top > low else len(BARS) - 1
        text.append(BARS[step], style=chosen_style if p.concurrency == chosen else "")
    return text
