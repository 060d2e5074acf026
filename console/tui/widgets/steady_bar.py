"""A progress bar that draws one value one way.

Textual's `Bar` rounds the value it is given down to half a cell of the width it has at that
moment, and keeps the rounded value. A value set before the bar's first layout (a snapshot that
came in while the screen was being built, or a bar that was hidden) has no width to round to, so
it was kept exact, and the same progress then drew with a different last glyph than it did once
set on a laid-out bar. `SteadyBar` gives its inner bar the value again whenever its size changes,
so the drawing depends on the value and the width alone."""

from __future__ import annotations

from textual import events
from textual.widgets import ProgressBar
from textual.widgets._progress_bar import Bar


class SteadyBar(ProgressBar):
    def on_resize(self, _: events.Resize) -> None:
        inner = self.query(Bar)
        if inner:
            inner.first().percentage = self.percentage
