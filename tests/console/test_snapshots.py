"""Snapshot tests of the fleet, generation-node and training-node screens, the modals, the
decommission screen, the read-only footer, the command palette, the fleet sorted and filtered,
the sparklines over 6 hours and the replay, with fixed data: no links, hand-written snapshots,
a frozen clock and a fixed terminal size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from rich.text import Text
from textual.widgets import Input, Static

from agents.rundir.schema import FailureSummary
from console.artifacts.decommission import Checklist, Item
from console.artifacts.pull import PullProgress
from console.replay import load
from console.tui.app import FleetdeckApp
from console.tui.messages import HistoryFetched
from console.tui.replay import ReplayApp, ReplayBar
from console.tui.screens.decommission import DecommissionScreen
from console.tui.screens.failures import FailuresScreen
from console.tui.screens.node import GenerateScreen, TrainScreen
from console.tui.widgets.confirm import ConfirmModal
from console.tui.widgets.fleet_table import FleetTable
from console.tui.widgets.graphs import HistoryGraphs
from console.tui.widgets.hostkey import HostKeyModal
from console.tui.widgets.live_static import LiveStatic
from console.tui.widgets.prompt import ValueModal
from console.tui.widgets.retry import RetryModal
from tests.console import data as d
from tests.console.conftest import on_screen, palette_search, until
from tests.console.screen import lasting

SIZE = (160, 48)


def fed_app() -> FleetdeckApp:
    app = FleetdeckApp(d.fleet(bell=False), connect=False, clock=lambda: d.NOW)
    app.animation_level = "none"
    lasting(app)
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
    await shown(pilot, GenerateScreen)


async def shown(pilot: Any, kind: type) -> None:
    """Wait for the node screen `kind` to be up, then draw it."""
    await until(pilot, lambda: on_screen(pilot.app, kind), 60, f"the {kind.__name__}")
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


def test_generation_log_pane_search(snap_compare: Any) -> None:
    """The log pane with focus (its keys in the footer), a search's matches highlighted and
    the view on the newest one."""
    async def run_before(pilot: Any) -> None:
        await open_gen(pilot)
        app: FleetdeckApp = pilot.app
        app.fetched["gen-1"].set_log("generate", d.log_reply(), select=True)
        assert isinstance(app.screen, GenerateScreen)
        app.screen.show_tab("tab-log")
        app.redraw()
        app.screen.log_pane.log_lines.focus()
        await pilot.press("slash", *"retract", "enter")
        await until(pilot, lambda: "match 2 of 2" in str(
            app.screen.query_one("#log-title", Static).render()), 60, "the newest match")

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_generation_sparklines_over_6_hours(snap_compare: Any) -> None:
    """`h` once: the sparklines titled 'last 6 h', drawn from 6 hours of history a minute a
    point (as the node's store serves that span; the fetch's answer is posted as the worker
    posts it, there being no link)."""
    async def run_before(pilot: Any) -> None:
        await quiet_gen(pilot)
        app: FleetdeckApp = pilot.app
        hist = app.fetched["gen-1"].history
        graphs = app.screen.query_one(HistoryGraphs)
        await pilot.press("h")
        await until(pilot, lambda: hist.span == "6h", 60, "the span cycled to 6 h")
        app.post_message(HistoryFetched("gen-1", d.history_items_hours(), "6h", 60.0))
        await until(pilot, lambda: hist.loaded and len(hist.points) == 360, 60,
                    "6 hours of points")
        app.redraw()
        await until(pilot, lambda: graphs.border_title == "last 6 h", 60, "the span titled")
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_training_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        await pilot.press("down", "down", "enter")  # train-1
        await shown(pilot, TrainScreen)

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_fleet_sorted_and_filtered(snap_compare: Any) -> None:
    """Sorted by rate, fastest first (`o` six times: node, role, run, status, progress, rate;
    then `O`), and filtered by `/` then 'gen': the training node is out, gen-3 (the fastest,
    below gen-1 in the fleet file) first, gen-2 (paused, 0/s) last; the bar says both."""
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        app: FleetdeckApp = pilot.app
        app.ingest("gen-3", d.generate_snapshot(run="old-run", alerts=[], progress=d.progress(
            run="old-run", rate_per_sec=17.92, completed=702_113, eta_hours=3.27,
            eta_p10_hours=2.9, eta_p90_hours=3.8)))
        app.state.nodes["gen-3"].received_at = d.NOW - 42
        app.state.set_link("gen-3", "reconnecting", "connection lost")
        await quiet(pilot)
        table = app.screen.query_one(FleetTable)
        await pilot.press(*"oooooo", "O")
        await pilot.press("slash", *"gen")
        await until(pilot, lambda: [str(r.key.value) for r in table.ordered_rows]
                    == ["gen-3", "gen-1", "gen-2"], 60, "the gen nodes by rate, fastest first")
        bar = app.screen.query_one("#fleet-bar", LiveStatic).content
        assert isinstance(bar, Text)
        assert "3 of 4 shown, filter: gen · sorted by Rate ↓" in bar.plain, bar.plain
        for field in app.screen.query(Input):
            field.cursor_blink = False
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_high_contrast_theme(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        pilot.app.theme = "fleetdeck-high-contrast"
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


# -- modals, the decommission screen, the read-only footer and the palette ----------------------

async def quiet(pilot: Any) -> None:
    """No alert toast over what the image is about (feed's alert notifies after it clears)."""
    await pilot.pause()
    pilot.app.clear_notifications()
    await pilot.pause()


async def quiet_gen(pilot: Any) -> None:
    await open_gen(pilot)
    await quiet(pilot)


async def over_gen(pilot: Any, modal: Any) -> None:
    """The modal over gen-1's screen, the way an action asks."""
    await quiet_gen(pilot)
    await pilot.app.push_screen(modal)
    await pilot.pause()
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False  # a blinking cursor would make the image flaky
    await pilot.pause()


def test_confirm_modal(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await over_gen(pilot, ConfirmModal(
            "Stop the job on gen-1?", "The job drains: requests in flight finish, then it "
            "stops. The servers stay up; resume starts it again."))

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_value_prompt_modal(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await over_gen(pilot, ValueModal("Concurrency on gen-1",
                                         "now 40 requests in flight per server", 40,
                                         minimum=0, server=2))

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_choice_modal(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await over_gen(pilot, RetryModal(
            "gen-1", "failed now 1,093, truncated 81,216 (loops 60,112, long 21,104)"))

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_host_key_modal(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        await quiet(pilot)
        await pilot.app.push_screen(HostKeyModal(
            "gen-3", "gpu-box-9", "SHA256:3kq0L8m2v0tY4dZ8bq6cN1n9rU2xW7pA5sE4fH0jK1g",
            "/home/op/.ssh/known_hosts"))
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


CHECKLIST = Checklist(node="gen-1", dest="/home/op/fleetdeck-pulls/gen-1/qwen-traces", items=[
    Item("run finished", True, "run qwen-traces is done"),
    Item("verify (S3 and counts)", True, "every closed batch in S3, counts agree"),
    Item("artifacts pulled", False, "11 of 214 files missing or different here",
         [f"logs/sglang_gpu{g}.log" for g in range(7)] + ["logs/generate.log",
          "logs/supervisor.log", "control.log.jsonl", "run.pin.json"]),
])


def test_decommission_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await feed(pilot)
        await quiet(pilot)
        app: FleetdeckApp = pilot.app
        screen = DecommissionScreen(app.fleet.node("gen-1"), Path("/home/op/fleetdeck-pulls"),
                                    lambda: None)
        await app.push_screen(screen)
        await until(pilot, lambda: "not connected" in str(
            screen.query_one("#items", Static).render()), 60, "the first check")
        screen.show_checklist(CHECKLIST)
        screen.show_progress(PullProgress(files_total=11, files_done=4, bytes_total=96_000_000,
                                          bytes_done=41_500_000))
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_failures_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await quiet_gen(pilot)
        app: FleetdeckApp = pilot.app
        summary = msgspec.convert(d.failure_summary(), FailureSummary)
        screen = FailuresScreen("gen-1", lambda: None, app.clock, summary=summary)
        await app.push_screen(screen)
        await until(pilot, lambda: on_screen(app, FailuresScreen), 60, "the failures screen")
        await pilot.press("down")  # the second class, its example lines below
        await pilot.pause()

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_read_only_footer(snap_compare: Any) -> None:
    app = FleetdeckApp(d.fleet(bell=False), read_only=True, connect=False,
                       clock=lambda: d.NOW)
    app.animation_level = "none"
    lasting(app)
    assert snap_compare(app, terminal_size=SIZE, run_before=quiet_gen)


def test_command_palette(snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await quiet_gen(pilot)
        # The image is of the search for 'pause' once it has ended (not of 'paus', whose
        # hits are the same but marked otherwise).
        await palette_search(pilot, "pause", min_hits=2,
                             on_open=lambda p: setattr(p.query_one(Input), "cursor_blink",
                                                       False))

    assert snap_compare(fed_app(), terminal_size=SIZE, run_before=run_before)


def test_replay(snap_compare: Any, tmp_path: Path) -> None:
    """`fleetdeck replay` on a pulled run's fixed history (120 samples, 10 s apart), the cursor
    moved 90 samples on (`>` three times): the node's screen as it was then, server 3
    restarting, the sparklines up to the cursor, the replay bar saying where it stands."""
    pulled = tmp_path / "pulls" / "gen-1" / "qwen-traces"
    pulled.mkdir(parents=True)
    (pulled / "history.jsonl").write_text("".join(
        msgspec.json.encode(item).decode() + "\n" for item in d.recorded_history()))
    rec = load(pulled.parent)
    assert rec.node == "gen-1" and len(rec.samples) == 120
    rec.run_dir = Path("/home/op/fleetdeck-pulls/gen-1/qwen-traces")  # not the temp path
    app = ReplayApp(rec)
    app.animation_level = "none"
    lasting(app)

    def bar() -> str:
        found = app.screen.query(ReplayBar)
        return str(found.first().render()) if found else ""

    async def run_before(pilot: Any) -> None:
        await until(pilot, lambda: on_screen(app, GenerateScreen) and "sample 1/120" in bar(),
                    60, "the node's screen at the first sample")
        await pilot.press(*["greater_than_sign"] * 3)
        await until(pilot, lambda: "sample 91/120" in bar() and "paused" in bar(), 60,
                    "the cursor 90 samples on")
        await quiet(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
