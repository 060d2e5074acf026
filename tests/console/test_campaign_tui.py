"""Campaigns in the TUI (issue 15, item 2): the fleet screen's campaign row above its nodes,
enter on it for the shards, and the actions on it sent to every node, each as that node's own
audited call. Against two live supervised runs on simulated GPUs; the screens themselves as
snapshots with fixed data."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from console.fleet import Campaign, ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.campaign import CampaignScreen
from console.tui.screens.node import GenerateScreen
from tests.console import data as d
from tests.console.conftest import on_screen, start_run, stop_run, until
from tests.console.screen import Recorder, lasting, progress, screen_text
from tests.console.test_actions_live import answer_value, confirm

SIZE = (160, 48)
AGENT = f"{sys.executable} -m agents.cli"


def audited(run_dir: Path) -> list[str]:
    """The methods the node's audit trail holds, in order."""
    path = run_dir / "control.log.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["method"] for line in path.read_text().splitlines() if line]


async def test_actions_on_a_campaign_row_reach_every_node(tmp_path: Path) -> None:
    runs = [start_run(tmp_path / f"node{i}", prompts=20_000, servers=1) for i in range(2)]
    try:
        nodes = [Node(name=f"gen-{i + 1}", run_dir=str(r.run_dir), local=True, agent=AGENT,
                      spec=str(r.spec)) for i, r in enumerate(runs)]
        fleet = Fleet(nodes=nodes, campaigns=[Campaign("traces", ["gen-1", "gen-2"])],
                      console=ConsoleSettings(bell=False), source="test-fleet")
        rec = Recorder()
        app = FleetdeckApp(fleet)
        names = ("gen-1", "gen-2")

        def every(cond: Any) -> bool:
            return all((p := progress(app, n)) is not None and cond(p) for n in names)

        async with app.run_test(size=SIZE, message_hook=rec) as pilot:
            await until(pilot, lambda: every(lambda p: p.status == "running"), 120,
                        "both nodes running")
            await until(pilot, lambda: "2/2 live" in screen_text(app), 120, "the campaign row")
            text = screen_text(app)
            assert text.index("▸ traces") < text.index("└ gen-1") < text.index("└ gen-2")
            assert app.current_campaign() == "traces" and app.current_node() is None

            # Launch on the campaign: the check round refuses (these specs have no [s3], so
            # no queue), each node says why, and nothing starts or stops anywhere.
            launches = [audited(r.run_dir).count("launch") for r in runs]
            await pilot.press("L")
            await confirm(pilot, app, "Launch campaign traces on 2 nodes?")
            await until(pilot, lambda: rec.has("traces: not launched: gen-1, gen-2 did not "
                                               "pass the check; nothing was started"), 120,
                        "the refused launch")
            assert rec.has("gen-1: Launch refused: ") and rec.has("gen-2: Launch refused: ")
            assert [audited(r.run_dir).count("launch") for r in runs] == launches
            assert every(lambda p: p.status == "running" and p.queue is None)

            await pilot.press("p")  # the cursor is on the campaign's row
            await until(pilot, lambda: every(lambda p: p.paused), 120, "both paused")
            await until(pilot, lambda: rec.has("traces: pause: all 2 nodes"), 120, "the summary")
            assert rec.has("gen-1: paused") and rec.has("gen-2: paused")
            await pilot.press("P")
            await until(pilot, lambda: every(lambda p: not p.paused), 120, "both unpaused")

            await pilot.press("c")
            await answer_value(pilot, app, "5")
            await pilot.press("enter")
            await until(pilot, lambda: every(lambda p: p.concurrency == 5), 120, "5 on both")

            # Enter: the campaign's nodes; its actions still go to every node.
            await pilot.press("enter")
            screen = await until(pilot, lambda: on_screen(app, CampaignScreen),
                                 120, "the campaign screen")
            await until(pilot, lambda: "gen-1" in screen_text(app) and "gen-2" in
                        screen_text(app) and "generate campaign · 2/2 live" in screen_text(app),
                        120, "the nodes listed")
            await pilot.press("m")
            await answer_value(pilot, app, "300")
            await pilot.press("enter")
            await until(pilot, lambda: every(lambda p: p.max_tokens == 300), 120,
                        "max_tokens 300 on both")
            # One node's action on a campaign: refused with a pointer, nothing sent.
            await pilot.press("l")
            await until(pilot, lambda: rec.has("traces: Logs is one node's action"), 120,
                        "the pointer to a node")
            await pilot.press("enter")  # the cursor is on the first node
            node = await until(pilot, lambda: on_screen(app, GenerateScreen), 120, "gen-1's screen")
            assert node.node_name == "gen-1" and screen is not app.screen
        # Each node audited each call itself (its own line, its own `who`).
        for r in runs:
            assert audited(r.run_dir)[-4:] == ["pause", "unpause", "resize", "max_tokens"]
    finally:
        for r in runs:
            stop_run(r)


# -- the screens, with fixed data ---------------------------------------------------------------

def campaign_app() -> FleetdeckApp:
    fleet = d.fleet(bell=False)
    fleet.campaigns = [Campaign("qwen-all", ["gen-1", "gen-2"])]
    app = FleetdeckApp(fleet, connect=False, clock=lambda: d.NOW)
    app.animation_level = "none"
    lasting(app)
    return app


async def feed(pilot: Any) -> None:
    app: FleetdeckApp = pilot.app
    def queue(node: str, committed: int, held: list[str]) -> dict[str, Any]:
        return {"node": node, "run_id": f"20261201T0000-{node}", "chunks": 914,
                "committed": committed, "committed_here": committed // 2, "held": held,
                "prompts_lines": 913_786, "chunk_size": 1000}

    app.ingest("gen-1", d.generate_snapshot(progress=d.progress(
        campaign="qwen-all", queue=queue("gen-1", 860, ["861", "862"]))))
    # gen-2 listed the queue a moment earlier: the roll-up takes the freshest count.
    app.ingest("gen-2", d.generate_snapshot(alerts=[], progress=d.progress(
        campaign="qwen-all", completed=412_040, failed=95, truncated=70_112,
        rate_per_sec=12.9, eta_hours=10.1, eta_p10_hours=9.6, eta_p90_hours=11.9,
        queue=queue("gen-2", 858, ["863"]))))
    app.ingest("train-1", d.train_snapshot())
    for name in ("gen-1", "gen-2", "train-1"):
        app.state.set_link(name, "connected", None)
        app.state.nodes[name].received_at = d.NOW - 1
    app.clear_notifications()
    app.redraw()
    await pilot.pause()


def test_fleet_screen_with_a_campaign(snap_compare: Any) -> None:
    assert snap_compare(campaign_app(), terminal_size=SIZE, run_before=feed)


def test_campaign_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        await pilot.press("enter")  # the cursor is on the campaign's row
        await until(pilot, lambda: on_screen(pilot.app, CampaignScreen), 60,
                    "the campaign screen")
        pilot.app.redraw()
        await pilot.pause()

    assert snap_compare(campaign_app(), terminal_size=SIZE, run_before=run_before)


async def test_a_node_given_back_shows_as_given_back_and_its_shard_still_counts(
        tmp_path: Path) -> None:
    # gen-2 passed decommission-check (its record is in the queue's prefix, as the TUI's
    # last look at the queue found) and no longer answers.
    app = campaign_app()
    gen2 = d.generate_snapshot(alerts=[], status="done", progress=d.progress(
        campaign="qwen-all", status="done", completed=456_893, total=456_893,
        failed=0, rate_per_sec=0.0, eta_hours=0.0))
    app.state.given_back["qwen-all"] = {"gen-2"}
    async with app.run_test(size=SIZE) as pilot:
        app.ingest("gen-1", d.generate_snapshot(progress=d.progress(
            campaign="qwen-all", completed=400_000, total=456_893)))
        app.state.set_link("gen-1", "connected", None)
        app.state.nodes["gen-1"].received_at = d.NOW - 1
        # It answered once (the TUI keeps the last snapshot of a lost link), then went.
        app.ingest("gen-2", gen2)
        app.state.set_link("gen-2", "unreachable", "connection refused")
        app.redraw()
        await until(pilot, lambda: "└ gen-2" in screen_text(app), 60, "gen-2's row")
        lines = screen_text(app).splitlines()
        campaign = next(x for x in lines if "campaign · 2 nodes" in x)
        assert "1/2 live, 1 given back" in campaign
        assert "856.9k/913.8k" in campaign  # both nodes' figures
        gen2 = next(x for x in lines if "└ gen-2" in x)
        assert gen2.rstrip().endswith("given back") and "unreachable" not in gen2
