"""The node view's sparkline span: `h` cycles the last hour, 6 hours and the whole run, and each
press fetches that window from the node's history store (the real agent answering from a run
directory that holds a 20-hour history)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.node import GenerateScreen
from console.tui.widgets.graphs import HistoryGraphs
from tests.agent.histories import STEP_S, write_history
from tests.agent.rundirs import finished_run
from tests.console.conftest import on_screen, until
from tests.console.screen import snapshot

HOURS20 = int(20 * 3600 / STEP_S)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """A finished run whose history.jsonl holds 20 hours ending at its last progress."""
    run = finished_run(tmp_path_factory.mktemp("span"))
    newest = json.loads((run / "progress.json").read_text())["updated_at"]
    t0 = newest - (HOURS20 - 1) * STEP_S
    (run / "history.jsonl").unlink()
    write_history(run / "history.jsonl", t0, HOURS20)
    return run, t0


async def test_the_span_key_changes_the_window_fetched(run: tuple[Path, float]) -> None:
    run_dir, t0 = run
    node = Node(name="sim-1", run_dir=str(run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    app = FleetdeckApp(Fleet(nodes=[node], console=ConsoleSettings(), source="test-fleet"))
    newest = t0 + (HOURS20 - 1) * STEP_S
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: snapshot(app) is not None, 120, "the node's snapshot")
        await pilot.press("enter")
        screen = await until(pilot, lambda: on_screen(app, GenerateScreen), 120, "node screen")
        hist = app.fetched["sim-1"].history
        await until(pilot, lambda: hist.loaded, 120, "the last hour fetched")
        assert hist.span == "1h" and hist.step_s == 10
        assert len(hist.points) == 360
        assert hist.points[0].t > newest - 3600 and hist.points[-1].t == newest
        assert screen.query_one(HistoryGraphs).border_title is None

        await pilot.press("h")
        await until(pilot, lambda: hist.span == "6h" and hist.loaded, 120, "6 hours fetched")
        assert hist.step_s == 60 and len(hist.points) == 360
        assert newest - hist.points[0].t > 5.9 * 3600
        await until(pilot, lambda: screen.query_one(HistoryGraphs).border_title == "last 6 h",
                    60, "the span titled")

        await pilot.press("h")
        await until(pilot, lambda: hist.span == "all" and hist.loaded, 120, "the run fetched")
        assert hist.points[0].t - t0 < 1800 and hist.points[-1].t == newest
        assert len(hist.points) <= 360 and hist.step_s == 300  # 20 h in at most 360 points
        await until(pilot, lambda: screen.query_one(HistoryGraphs).border_title == "whole run",
                    60, "the span titled")

        await pilot.press("h")
        await until(pilot, lambda: hist.span == "1h" and hist.loaded, 120, "back to the hour")
        assert hist.step_s == 10 and len(hist.points) == 360
