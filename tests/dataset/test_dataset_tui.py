"""The TUI's dataset action (T): the selected node's pulled copy becomes a dataset in
PULL_DIR/datasets/NODE, and the outcome is said; a copy edited after the pull is refused."""

from __future__ import annotations

import sys
from pathlib import Path

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from tests.console.conftest import until
from tests.dataset.test_dataset import fleet_file, fleetdeck, make_run


def said(app: FleetdeckApp) -> str:
    return " | ".join(str(n.message) for n in app._notifications)


async def test_the_dataset_action_writes_the_pulled_runs_dataset(tmp_path: Path) -> None:
    run_dir = tmp_path / "node" / "r1"
    make_run(run_dir)
    pulled = fleetdeck(fleet_file(tmp_path, run_dir), "pull", "gen-1", "--all", tmp=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    pulls = tmp_path / "pulls"
    node = Node(name="gen-1", run_dir=str(run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    fleet = Fleet(nodes=[node], console=ConsoleSettings(pull_dir=str(pulls)), source="(test)")
    app = FleetdeckApp(fleet, connect=False)
    async with app.run_test(size=(150, 45)) as pilot:
        await app.show_node("gen-1")
        await pilot.pause()
        await pilot.press("T")
        await until(pilot, lambda: "Dataset: 20 rows" in said(app), 180,
                    "the dataset written")
        out = pulls / "datasets" / "gen-1"
        assert (out / "README.md").is_file() and len(list((out / "data").iterdir())) == 1
        assert str(out) in said(app)

        batch = pulls / "gen-1" / "r1" / "completions" / "completions_000000.jsonl"
        batch.write_bytes(batch.read_bytes().replace(b"answer 1 ", b"answer 7 "))
        await pilot.press("T")
        await until(pilot, lambda: "Dataset refused" in said(app), 180, "the refusal")
        assert "changed since it was pulled" in said(app)
