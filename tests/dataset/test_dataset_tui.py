"""The TUI's dataset action (T): the selected node's pulled copy becomes a dataset in
PULL_DIR/datasets/NODE, and the outcome is said; a copy edited after the pull is refused. On a
campaign's row, the campaign through its commits in S3 (the real SeaweedFS)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from console.fleet import Campaign, ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from tests.console.conftest import until
from tests.dataset.test_dataset import fleet_file, fleetdeck, make_run
from tests.servers.s3 import running_s3


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


async def test_the_dataset_action_on_a_campaign_row_reads_its_commits_in_s3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No node is up: the campaign is read from S3 (its [[campaigns]] s3) with the console's
    own credentials, into PULL_DIR/datasets/CAMPAIGN."""
    from tests.dataset.test_dataset_campaign import build

    pulls = tmp_path / "pulls"
    with running_s3() as s3:
        c = build(s3)
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        nodes = [Node(name=n, run_dir=f"/runs/{n}", local=True,
                      agent=f"{sys.executable} -m agents.cli") for n in ("a", "b")]
        fleet = Fleet(nodes=nodes, campaigns=[Campaign("tq", ["a", "b"], s3=c.url,
                                                       endpoint_url=s3.endpoint_url)],
                      console=ConsoleSettings(pull_dir=str(pulls)), source="(test)")
        app = FleetdeckApp(fleet, connect=False)
        async with app.run_test(size=(150, 45)) as pilot:
            await until(pilot, lambda: app.current_campaign() == "tq", 60, "the campaign row")
            await pilot.press("T")
            out = pulls / "datasets" / "tq"
            await until(pilot, lambda: f"Dataset: 17 rows in 1 shard(s), 3 failed apart, in "
                        f"{out}" in said(app), 180, "the campaign's dataset")
            card = (out / "README.md").read_text()
            assert "| http_500 | 1 |" in card and "**b differs** in sglang_version" in card

            # Its S3 gone: said as a failure, the terminal still there.
            s3.kill()
            await pilot.press("T")
            await until(pilot, lambda: "Dataset failed:" in said(app), 180, "the failure")
            assert (out / "README.md").is_file(), "the earlier export left as it was"
