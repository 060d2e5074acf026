"""The report from the TUI (Pilot): `H` on a node writes its report from the node's live link
into PULL_DIR/reports/NODE; on a campaign's row, one report of every node. The nodes are
local: the real agent's `serve --stdio` answers `history` from the recorded run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from console.fleet import Campaign, ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from tests.console.conftest import until
from tests.console.screen import Recorder
from tests.report.test_report import table

AGENT = str(Path(sys.executable).parent / "fleetdeck-agent")
SIZE = (160, 48)


def node(name: str, run_dir: Path) -> Node:
    return Node(name=name, run_dir=str(run_dir), local=True, agent=AGENT)


async def test_h_writes_a_node_report_then_a_campaign_report(
        recorded: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-run"
    shutil.copytree(recorded, other)
    pulls = tmp_path / "pulls"
    fleet = Fleet(nodes=[node("gen-1", recorded), node("gen-2", other)],
                  console=ConsoleSettings(pull_dir=str(pulls)), source="fleet.toml")
    rec = Recorder()
    app = FleetdeckApp(fleet)
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await until(pilot, lambda: all(app.state.nodes[n].link == "connected"
                                       for n in ("gen-1", "gen-2")), 120, "both links")
        assert app.current_node() == "gen-1"
        await pilot.press("H")
        page = pulls / "reports" / "gen-1" / "report.html"
        await until(pilot, lambda: rec.has(f"report written: {page}"), 180, "the report")
        (row,) = table(page)
        assert row["node"] == "gen-1" and row["status"] == "done"
        assert len(list((page.parent / "plots").glob("*.png"))) == 7

    fleet.campaigns = [Campaign("traces", ["gen-1", "gen-2"])]
    rec = Recorder()
    app = FleetdeckApp(fleet)
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await until(pilot, lambda: all(app.state.nodes[n].link == "connected"
                                       for n in ("gen-1", "gen-2")), 120, "both links")
        assert app.current_campaign() == "traces"
        await pilot.press("H")
        page = pulls / "reports" / "traces" / "report.html"
        await until(pilot, lambda: rec.has(f"report written: {page}"), 180, "the report")
        assert [r["node"] for r in table(page)] == ["gen-1", "gen-2", "traces"]
