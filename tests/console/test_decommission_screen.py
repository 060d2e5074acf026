"""The decommission screen on a finished run: red items, the pull key, then all green."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from textual.widgets import Label, ProgressBar, Static

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.decommission import DecommissionScreen
from tests.console.conftest import on_screen, until
from tests.servers.s3 import S3Server


async def test_red_items_then_pull_then_all_green(finished_run: Path, tmp_path: Path,
                                                  s3: S3Server,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in s3.env().items():  # the local agent holds the S3 keys, as a node would
        monkeypatch.setenv(key, value)
    pulls = tmp_path / "pulls"
    node = Node(name="gen-1", run_dir=str(finished_run), local=True,
                agent=f"{sys.executable} -m agents.cli")
    fleet = Fleet(nodes=[node], console=ConsoleSettings(pull_dir=str(pulls)), source="(test)")
    app = FleetdeckApp(fleet)
    async with app.run_test(size=(150, 45)) as pilot:
        await until(pilot, lambda: app.state.nodes["gen-1"].link == "connected", 120, "connected")
        await pilot.press("k")
        screen = await until(pilot, lambda: on_screen(app, DecommissionScreen),
                             120, "the decommission screen")
        assert isinstance(screen, DecommissionScreen)
        items = screen.query_one("#items", Static)
        verdict = screen.query_one("#verdict", Label)
        await until(pilot, lambda: "NOT safe" in str(verdict.render()), 120, "the first check")
        text = str(items.render())
        assert "✓ run finished" in text and "✓ verify (S3 and counts)" in text
        assert "✗ artifacts pulled" in text and "logs/big.log" in text
        assert "verdict-bad" in verdict.classes
        await pilot.press("u")
        bar = screen.query_one("#pull-bar", ProgressBar)
        await until(pilot, lambda: "SAFE to give" in str(verdict.render()) and
                    "NOT" not in str(verdict.render()), 180, "all green after the pull")
        assert bar.display and bar.progress == bar.total
        assert "✗" not in str(items.render()) and "verdict-ok" in verdict.classes
        assert (pulls / "gen-1" / "test-run" / "logs" / "big.log").stat().st_size == \
            (finished_run / "logs" / "big.log").stat().st_size


async def test_a_campaign_node_gets_the_campaign_items_in_the_tui(tmp_path: Path) -> None:
    """The TUI's checklist of a generation campaign's node has the headless one's campaign
    item (no chunk of the queue held): a node cannot look safe on one and not on the other.
    Here the run never took work from a queue, so the item says so."""
    from console.fleet import Campaign

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text('[run]\nname = "r"\n')
    node = Node(name="gen-1", run_dir=str(run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    fleet = Fleet(nodes=[node], campaigns=[Campaign(name="c", nodes=["gen-1"])],
                  console=ConsoleSettings(pull_dir=str(tmp_path / "pulls")), source="(test)")
    app = FleetdeckApp(fleet)
    async with app.run_test(size=(150, 45)) as pilot:
        await until(pilot, lambda: app.state.nodes["gen-1"].link == "connected", 120, "connected")
        await pilot.press("down", "k")  # the campaign's row first, then its node's
        screen = await until(pilot, lambda: on_screen(app, DecommissionScreen),
                             120, "the decommission screen")
        assert isinstance(screen, DecommissionScreen)
        verdict = screen.query_one("#verdict", Label)
        await until(pilot, lambda: "NOT safe" in str(verdict.render()), 120, "the check")
        text = str(screen.query_one("#items", Static).render())
        assert "✗ no chunk held" in text and "not a node of a campaign" in text
