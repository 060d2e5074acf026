"""Snapshot tests of the fleet, generation-node and training-node screens with fixed data: no
links, hand-written snapshots, a frozen clock and a fixed terminal size."""

from __future__ import annotations

from typing import Any

from console.tui.app import FleetdeckApp
from console.tui.screens.node import GenerateScreen
from tests.console import data as d

SIZE = (160, 48)


def fed_app() -> FleetdeckApp:
    app = FleetdeckApp(d.fleet(bell=False), connect=False, clock=lambda: d.NOW)
    app.animation_level = "none"
    return app


async def feed(pilot: Any) -> None:
    app: FleetdeckApp = pilot.app
    app.ingest("gen-1", d.generate_snapshot())
    app.ingest("gen-2", d.generate_snapshot(
        run="qwen-more", status="paused", alerts=[],
        progress=d.progress(run="qwen-more", completed=12_040, total=200_000, paused=True,
                            status="paused", rate_per_sec=0.0, eta_hours=None, failed=0)))
    app.ingest("train-1", d.train_snapshot())
    for name in ("gen-1", "gen-2", "train-1"):
        app.state.set_link(name, "connected", None)
        app.state.nodes[name].received_at = d.NOW - 1
    # gen-3 was seen 42 s ago and has been reconnecting since: its figures show their age.
    app.ingest("gen-3", d.generate_snapshot(run="old-run", status="running", alerts=[]))
    app.state.nodes["gen-3"].received_at = d.NOW - 42
    app.state.set_link("gen-3", "reconnecting", "connection lost")
    app.fetched["gen-1"].history.load(d.history_items())
    app.clear_notifications()
    app.redraw()
    await pilot.pause()


async def open_gen(pilot: Any) -> None:
    await feed(pilot)
    await pilot.press("enter")  # the cursor is on gen-1
    await pilot.pause()
    pilot.app.redraw()
    await pilot.pause()


def test_fleet_screen(snap_compare: Any) -> None:
    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=feed)


def test_generation_screen(snap_compare: Any) -> None:
    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=open_gen)


def test_generation_samples_pane(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await open_gen(pilot)
        app: FleetdeckApp = pilot.app
        app.fetched["gen-1"].set_samples(d.samples())
        assert isinstance(app.screen, GenerateScreen)
        app.screen.show_tab("tab-samples")
        app.redraw()
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_training_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        await pilot.press("down", "down", "enter")  # train-1
        await pilot.pause()
        pilot.app.redraw()
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_high_contrast_theme(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        pilot.app.theme = "fleetdeck-high-contrast"
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)
