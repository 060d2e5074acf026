"""The run panel's Truncated cell names the loops and the long answers apart when there are
loops (more tokens buy a loop nothing), and stays as it was when there are none."""

from __future__ import annotations

import json

from textual.theme import Theme

from agents.rundir.schema import snapshot_decoder
from console.tui.widgets.run_panel import run_grid
from tests.console import data as d


def truncated_cell(**progress: int) -> str:
    raw = d.generate_snapshot()
    raw["progress"].update(progress)
    grid = run_grid(snapshot_decoder.decode(json.dumps(raw)), Theme("t", "#00ff00"), False)
    labels = [str(c) for c in grid.columns[0].cells]
    return str(list(grid.columns[1].cells)[labels.index("Truncated")])


def test_the_truncated_cell_splits_loops_from_long_answers() -> None:
    split = truncated_cell(completed=100_000, truncated=17_500, truncated_loops=12_000)
    assert split.endswith("(17,500) · loops 12,000, long 5,500"), split
    plain = truncated_cell(completed=100_000, truncated=17_500, truncated_loops=0)
    assert plain.endswith("(17,500)"), plain
