"""What the console shows of auto-tune, the ETA band, cost and the idle alert: the idle
alert names the user's keys for its actions, a price in the fleet file overrides the run's,
the fleet bar adds up rates and finds the last ETA, and the palette's "Auto-tune" reaches a
node's control.json through a real agent."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from textual.command import CommandList, CommandPalette

from agents.rundir.control import initial_control
from agents.rundir.schema import encoder
from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.node import GenerateScreen
from tests.console import data as d
from tests.console.conftest import on_screen, until
from tests.console.screen import screen_text

SIZE = (160, 48)


def words(app: FleetdeckApp) -> str:
    """The screen's text with every run of blanks and line ends as one space (a long alert
    wraps)."""
    return " ".join(screen_text(app).split())


def fleet(price: float | None = None, **console: Any) -> Fleet:
    return Fleet(nodes=[Node(name="gen-1", run_dir="/r", host="gpu-box-7",
                             cost_per_gpu_hour=price),
                        Node(name="gen-2", run_dir="/r", host="gpu-box-8")],
                 console=ConsoleSettings(bell=False, **console), source="fleet.toml")


def idle_snapshot() -> dict[str, Any]:
    p = d.progress(status="done", completed=913_786, eta_hours=0.0, eta_p10_hours=0.0,
                   eta_p90_hours=0.0, rate_per_sec=0.0)
    return d.generate_snapshot(status="done", progress=p, alerts=[{
        "code": "idle", "severity": "warning", "since": d.NOW - 1800,
        "message": "GPUs idle on gpu-box-7 — pull and decommission (the run has been done "
                   "for 30 min; 7 server(s) still up, $17.43/h: $8.72 so far)",
        "actions": ["pull", "decommission"]}])


async def fed(pilot: Any, gen1: dict[str, Any], gen2: dict[str, Any]) -> None:
    app: FleetdeckApp = pilot.app
    app.ingest("gen-1", gen1)
    app.ingest("gen-2", gen2)
    for name in ("gen-1", "gen-2"):
        app.state.set_link(name, "connected", None)
    app.clear_notifications()
    app.redraw()
    await pilot.pause()


async def test_the_idle_alert_names_the_users_keys() -> None:
    app = FleetdeckApp(fleet(keymap={"pull": "U"}), connect=False, clock=lambda: d.NOW)
    async with app.run_test(size=SIZE) as pilot:
        await fed(pilot, idle_snapshot(), d.generate_snapshot(alerts=[]))
        await until(pilot, lambda: "GPUs idle on gpu-box-7" in screen_text(app), 60,
                    "the idle alert in the fleet view")
        assert "U pull · k decommission" in words(app)
        await pilot.press("enter")  # gen-1's screen: the same alert, the same keys
        await until(pilot, lambda: on_screen(app, GenerateScreen), 60, "gen-1")
        app.redraw()
        await until(pilot, lambda: "U pull · k decommission" in words(app), 60,
                    "the keys on the node screen")


async def test_a_fleet_file_price_overrides_the_runs_and_the_bar_adds_up() -> None:
    app = FleetdeckApp(fleet(price=4.0), connect=False, clock=lambda: d.NOW)
    slow = d.progress(eta_hours=12.5, eta_p10_hours=11.0, eta_p90_hours=15.25,
                      rate_per_sec=5.62)
    async with app.run_test(size=SIZE) as pilot:
        await fed(pilot, d.generate_snapshot(alerts=[]),
                  d.generate_snapshot(alerts=[], progress=slow))
        text = await until(pilot, lambda: screen_text(app) if "in all" in screen_text(app)
                           else None, 60, "the fleet bar")
        # 14.37 + 5.62 req/s; 7 servers x 2230 tok/s on each node; gen-2 finishes last;
        # gen-1 at the fleet file's $4/GPU-h (61 GPU-h = $244) + gen-2's own $151.89.
        assert "19.99 req/s, 31.2k tok/s in all" in text
        assert "last ETA 12.5 h (11.0 h–15.2 h) (gen-2)" in text
        assert "$395.89 so far" in text
        assert "8.9 h 7.8–11" in text and "12.5 h 11–15" in text  # the ETA column's bands
        await pilot.press("enter")
        await until(pilot, lambda: on_screen(app, GenerateScreen), 60, "gen-1")
        app.redraw()
        text = await until(pilot, lambda: screen_text(app) if "GPU time" in screen_text(app)
                           else None, 60, "the run panel")
        assert "$244.00 · $0.30/M tok" in text  # $244 / 812 M output tokens
        assert "61.0 GPU-h · 7 GPUs × $4.00/h (fleet)" in text
        assert "8.9 h (7.8 h–10.6 h)" in text
        assert "auto on 4 GPUs" in text


async def test_the_palettes_auto_tune_reaches_the_node(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "control.json").write_bytes(encoder.encode(initial_control(8, 256)))
    node = Node(name="sim-1", run_dir=str(run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    app = FleetdeckApp(Fleet(nodes=[node], console=ConsoleSettings(bell=False),
                             source="test-fleet"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.nodes["sim-1"].link == "connected", 120,
                    "the local agent")
        await pilot.press("ctrl+p")
        palette = await until(pilot, lambda: on_screen(app, CommandPalette), 120, "the palette")
        await pilot.press(*"auto-tune")
        results = palette.query_one(CommandList)
        await until(pilot, lambda: results.option_count and "[a]" in str(
            results.get_option_at_index(0).prompt), 120, "the Auto-tune hit naming a")
        await pilot.press("enter")

        def control() -> dict[str, Any]:
            return json.loads((run_dir / "control.json").read_text())

        await until(pilot, lambda: control()["concurrency"]["auto"], 120, "auto in control.json")
        assert control()["rev"] == 2
        audit = [json.loads(x) for x in (run_dir / "control.log.jsonl").read_text().splitlines()]
        assert audit[-1]["method"] == "resize" and audit[-1]["params"]["value"] == "auto"
        assert audit[-1]["who"] != "auto"  # a person asked; the tuner signs its own changes
