"""`fleetdeck replay`: the TUI on a finished run's recorded history (Pilot), its time cursor
stepped, jumped and played, the screen drawing the sample under it; and what it refuses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from console.replay import NoRecording, load, parse_time
from console.tui.replay import ReplayApp, ReplayBar, TimeModal
from console.tui.screens.node import GenerateScreen
from tests.agent.histories import write_history
from tests.console.conftest import on_screen, until
from tests.console.screen import Recorder, screen_text

SIZE = (160, 48)


def samples(run_dir: Path) -> list[dict[str, object]]:
    """The recorded samples, one per moment: the engine's last sample when it ends may repeat
    the one before it (same `updated_at`), and replay keeps one sample per moment, the last."""
    by_time: dict[float, dict[str, object]] = {}
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        item = json.loads(line)
        by_time[float(item["updated_at"])] = item
    return [by_time[t] for t in sorted(by_time)]


def bar(app: ReplayApp) -> str:
    found = app.screen.query(ReplayBar)
    return str(found.first().render()) if found else ""


async def test_replay_steps_jumps_and_plays_through_the_recorded_run(
        recorded: Path, tmp_path: Path) -> None:
    pulled = tmp_path / "pulls" / "gen-1" / "test-run"
    shutil.copytree(recorded, pulled)
    items = samples(recorded)
    rec = load(pulled.parent)  # a node's pull folder holding one run
    assert rec.node == "gen-1" and len(rec.samples) == len(items)
    rec_app = Recorder()
    app = ReplayApp(rec)
    async with app.run_test(size=SIZE, message_hook=rec_app) as pilot:
        await until(pilot, lambda: on_screen(app, GenerateScreen) and "sample 1/" in bar(app),
                    60, "the node's screen at the first sample")

        def shows(i: int) -> bool:
            snap = app.state.nodes["gen-1"].snapshot
            return (rec.cursor == i and snap is not None and snap.progress is not None
                    and snap.progress.completed == items[i]["completed"]
                    and f"sample {i + 1}/{len(items)}" in bar(app)
                    and f"{items[i]['completed']} / {items[i]['total']}" in screen_text(app))

        await until(pilot, lambda: shows(0), 60, "sample 1 on screen")
        await pilot.press("full_stop")
        await until(pilot, lambda: shows(1), 60, "one step on")
        await pilot.press("comma")
        await until(pilot, lambda: shows(0), 60, "one step back")
        await pilot.press("greater_than_sign")
        await until(pilot, lambda: shows(30), 60, "30 steps on")

        await pilot.press("g")
        modal = await until(pilot, lambda: on_screen(app, TimeModal), 60, "the jump prompt")
        await pilot.press(*"soon", "enter")
        await until(pilot, lambda: "'soon' is not a time" in str(
            modal.query_one("#replay-error").render()), 60, "the refusal")
        await pilot.press("escape")
        await pilot.press("g")
        await until(pilot, lambda: on_screen(app, TimeModal), 60, "the jump prompt")
        await pilot.press(*"+5s", "enter")
        start = float(str(items[0]["updated_at"]))
        want = max(i for i, it in enumerate(items) if float(str(it["updated_at"])) <= start + 5)
        await until(pilot, lambda: shows(want), 60, "5 s into the run")

        await pilot.press("g")
        await until(pilot, lambda: on_screen(app, TimeModal), 60, "the jump prompt")
        await pilot.press(*"end", "enter")
        last = len(items) - 1
        await until(pilot, lambda: shows(last) and "done" in screen_text(app), 60, "the end")

        # Play from the start (at the end, play starts over) at 1x: the ~13 s run passes
        # through the samples between, to the end, then stops there. (At 10x it played
        # through in ~1.3 s, and a loaded box's polling missed it between the ends: ci11.)
        await pilot.press("left_square_bracket", "left_square_bracket")
        await pilot.press("space")
        await until(pilot, lambda: app.playing and 0 < rec.cursor < last
                    and "playing 1x" in bar(app), 60, "playing, between the ends")
        await until(pilot, lambda: not app.playing and shows(last), 60, "played to the end")
        assert "paused" in bar(app)

        await pilot.press("p")  # a node action: nothing is sent in a replay
        await until(pilot, lambda: rec_app.has("replay: pause is not available"), 60,
                    "the refusal")


def test_nothing_to_replay_is_named(recorded: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoRecording, match=r"no run directory with a history\.jsonl"):
        load(tmp_path / "empty")
    for name in ("a", "b"):
        shutil.copytree(recorded, tmp_path / "two" / name)
    with pytest.raises(NoRecording, match="holds 2 runs"):
        load(tmp_path / "two")
    done = subprocess.run([sys.executable, "-m", "console.cli", "replay", str(recorded),
                           "--at", "tomorrow"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "'tomorrow' is not a time" in done.stderr


def test_times_to_jump_to() -> None:
    start = 1_796_539_200.0  # 2026-12-06 06:40:00 UTC
    end = start + 7200
    assert parse_time("start", start, end) == start and parse_time("end", start, end) == end
    assert parse_time("+1h30m", start, end) == start + 5400
    assert parse_time("+45s", start, end) == start + 45
    assert parse_time("07:10", start, end) == start + 1800
    assert parse_time("06:00", start, end) == start + 86400 - 2400  # the next day's
    assert parse_time("2026-12-06 08:00:00", start, end) == start + 4800
    with pytest.raises(ValueError, match="25:00"):
        parse_time("25:00", start, end)


async def test_a_node_folder_or_a_typed_time_with_markup_is_shown_as_written(
        tmp_path: Path) -> None:
    """The bar names the node by its pull folder, the jump prompt echoes what was typed: a
    `[` in either is shown, never read as Textual markup (no MarkupError, no restyle)."""
    name = "[bold]x[red]"
    run = tmp_path / "pulls" / name / "run"
    run.mkdir(parents=True)
    write_history(run / "history.jsonl", 1_700_000_000.0, 20)
    app = ReplayApp(load(run.parent))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: f"REPLAY {name} ·" in bar(app)
                    and f"REPLAY {name} ·" in screen_text(app), 60, "the bar, named")
        await pilot.press("g")
        modal = await until(pilot, lambda: on_screen(app, TimeModal), 60, "the jump prompt")
        await pilot.press(*"[bold]x[/", "enter")
        await until(pilot, lambda: "'[bold]x[/' is not a time" in str(
            modal.query_one("#replay-error").render())
            and "'[bold]x[/' is not a time" in screen_text(app), 60, "the refusal, as typed")
        assert not app.render_errors
