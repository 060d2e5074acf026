"""The log pane as a person uses it, through the real TUI and a real agent (a local node's
`serve --stdio` on a run dir): a line appended to the node's log shows up without a key
while it follows; `/` searches, n and N move between the matches (highlighted); `w` filters
by level, a traceback kept with its error; switching logs and back finds each as it was
left; and the pane's keys (f, n) do not reach the node view's (fleet, next node)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from rich.segment import Segment
from textual.markup import to_content
from textual.widgets import Input, Label

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.node import GenerateScreen
from console.tui.widgets.log_pane import MATCH, LogPane
from tests.console.conftest import on_screen, until
from tests.console.screen import Recorder

SIZE = (160, 48)
TIME = "2026-12-06 10:00:00,000"


def generate_log() -> list[str]:
    lines = [f"{TIME} INFO engine: batch {i} done" for i in range(300)]
    lines[100] = f"{TIME} WARNING engine: server 1 slow (oom risk)"
    lines[200:201] = [f"{TIME} ERROR engine: server 0 died: oom",
                      "Traceback (most recent call last):",
                      '  File "serve.py", line 7, in <module>',
                      "torch.OutOfMemoryError: CUDA out of memory"]
    lines[250] = f"{TIME} INFO engine: oom retry queued"
    return lines


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "generate.log").write_text("\n".join(generate_log()) + "\n")
    (run / "logs" / "supervisor.log").write_text(
        "".join(f"{TIME} INFO supervisor: tick {i}\n" for i in range(40)))
    return run


def fleet(run_dir: Path) -> Fleet:
    node = Node(name="loc-1", run_dir=str(run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    return Fleet(nodes=[node], console=ConsoleSettings(bell=False), source="test-fleet")


def pane(app: FleetdeckApp) -> LogPane:
    return app.screen.query_one(LogPane)


def title(app: FleetdeckApp) -> str:
    return str(pane(app).query_one("#log-title", Label).render())


def in_view(app: FleetdeckApp, text: str) -> bool:
    """A line holding `text` is within the visible rows of the log."""
    lines = pane(app).log_lines
    top = int(lines.scroll_y)
    shown = lines.lines[top: top + lines.scrollable_content_region.height]
    return any(text in line for line in shown)


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


async def open_log(pilot: Any, app: FleetdeckApp) -> LogPane:
    await until(pilot, lambda: app.state.nodes["loc-1"].link == "connected", 120,
                "the local agent connected")
    await pilot.press("enter")
    await until(pilot, lambda: on_screen(app, GenerateScreen), 120, "the node screen")
    await pilot.press("l")
    await until(pilot, lambda: pane(app).view is not None
                and pane(app).view.log.name == "generate" and len(pane(app).lines) == 303
                and app.screen.active_tab == "tab-log", 120, "the generate log")
    assert pane(app).log_lines.has_focus
    return pane(app)


async def test_follow_search_level_and_switching_back(run_dir: Path) -> None:
    rec = Recorder()
    app = FleetdeckApp(fleet(run_dir))
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        log = await open_log(pilot, app)
        assert "following" in title(app) and in_view(app, "batch 299 done")

        # Follow: a line appended on the node shows up, no key pressed, the view at the end.
        append(run_dir / "logs" / "generate.log", f"{TIME} INFO engine: appended line\n")
        await until(pilot, lambda: log.lines[-1].endswith("appended line")
                    and in_view(app, "appended line"), 120, "the appended line")

        # Search: enter goes to the newest match at or above the view, N up, n down; the
        # matches are highlighted; the screen stays the node's (n is not next node here).
        await pilot.press("slash")
        box = log.query_one("#log-search", Input)
        assert box.has_focus
        await pilot.press(*"oom", "enter")
        assert log.view is not None and log.view.search == "oom"
        await until(pilot, lambda: "match 3 of 3" in title(app), 60, "the newest match")
        assert in_view(app, "oom retry queued") and log.log_lines.has_focus
        await pilot.press("N")
        await until(pilot, lambda: "match 2 of 3" in title(app), 60, "the match above")
        assert in_view(app, "server 0 died: oom") and not in_view(app, "appended line")
        await pilot.press("N")
        await until(pilot, lambda: "match 1 of 3" in title(app), 60, "the first match")
        assert in_view(app, "server 1 slow (oom risk)")
        await pilot.press("n")
        await until(pilot, lambda: "match 2 of 3" in title(app), 60, "down again")
        assert isinstance(app.screen, GenerateScreen)
        strip = log.log_lines.render_line(
            log.log_lines.lines.index(f"{TIME} ERROR engine: server 0 died: oom")
            - int(log.log_lines.scroll_y))
        lit = "".join(s.text for s in Segment.filter_control(strip)
                      if s.style is not None and s.style.reverse and s.style.bold)
        assert lit == "oom" and MATCH.reverse

        # Switch to the supervisor's log and back: the generate log as it was left.
        place = log.log_lines.scroll_y
        await pilot.press("l")
        await until(pilot, lambda: log.view is not None and log.view.log.name == "supervisor"
                    and log.lines[-1].endswith("tick 39"), 120, "the supervisor log")
        assert "/oom" not in title(app)
        await pilot.press("l")
        await until(pilot, lambda: log.view is not None and log.view.log.name == "generate",
                    120, "back to the generate log")
        assert log.log_lines.scroll_y == place and "/oom: match 2 of 3" in title(app)
        assert in_view(app, "server 0 died: oom")

        # Level: warnings and worse (the traceback stays with its error), errors only, all.
        await pilot.press("w")
        await until(pilot, lambda: "level warning+" in title(app), 60, "warning+")
        assert log.lines == [
            f"{TIME} WARNING engine: server 1 slow (oom risk)",
            f"{TIME} ERROR engine: server 0 died: oom", "Traceback (most recent call last):",
            '  File "serve.py", line 7, in <module>',
            "torch.OutOfMemoryError: CUDA out of memory"]
        await pilot.press("w")
        await until(pilot, lambda: "level error+" in title(app), 60, "error+")
        assert len(log.lines) == 4 and log.lines[0].endswith("died: oom")
        await pilot.press("w")
        await until(pilot, lambda: len(log.lines) == 304, 60, "every line again")

        # f: not following (the fleet's key elsewhere): no call goes out for this log.
        await pilot.press("f")
        await until(pilot, lambda: "not following" in title(app), 60, "follow off")
        assert isinstance(app.screen, GenerateScreen) and app.log_follower.due() is None
        await pilot.press("f")
        await until(pilot, lambda: "following" in title(app)
                    and in_view(app, "appended line"), 60, "following again, at the end")

        # Escape: the search first, then the fleet.
        await pilot.press("escape")
        await until(pilot, lambda: "/oom" not in title(app), 60, "search cleared")
        assert isinstance(app.screen, GenerateScreen)
        assert not app.render_errors and not [n for n in rec.notes if "log " in n]


async def test_a_log_that_goes_stops_following_and_says_why(run_dir: Path) -> None:
    rec = Recorder()
    app = FleetdeckApp(fleet(run_dir))
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        log = await open_log(pilot, app)
        path = run_dir / "logs" / "generate.log"
        path.unlink()
        path.symlink_to(run_dir / "logs" / "supervisor.log")  # hostile: refused by the agent
        await until(pilot, lambda: rec.has("not following it"), 120, "the refusal reported")
        assert rec.has("symbolic link") and "not following" in title(app)
        assert len(log.lines) == 303 and not any("supervisor" in x for x in log.lines)


OLD_AGENT = Path(__file__).resolve().parents[1] / "servers" / "old_log_agent.py"


async def test_an_old_agent_s_log_is_shown_not_followed(run_dir: Path) -> None:
    """An agent from before following answers a tail only: the pane shows it, not following,
    and says once (in the log) that a bootstrap upgrades the agent."""
    rec = Recorder()
    node = Node(name="loc-1", run_dir=str(run_dir), local=True,
                agent=f"{sys.executable} {OLD_AGENT}")
    app = FleetdeckApp(Fleet(nodes=[node], console=ConsoleSettings(bell=False),
                             source="test-fleet"))
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await until(pilot, lambda: app.state.nodes["loc-1"].link == "connected", 120,
                    "the local agent connected")
        await pilot.press("enter")
        await until(pilot, lambda: on_screen(app, GenerateScreen), 120, "the node screen")
        await pilot.press("l")
        await until(pilot, lambda: pane(app).view is not None
                    and any("batch 299 done" in x for x in pane(app).lines)
                    and app.screen.active_tab == "tab-log", 120, "the generate log")
        log = pane(app)
        assert "not following" in title(app) and app.log_follower.due() is None
        assert log.lines[-1] == "-- fleetdeck: this agent cannot follow logs: fleetdeck " \
            "bootstrap NODE upgrades it --"
        assert not rec.has("not following it") and not app.render_errors


async def test_a_search_with_markup_in_it_is_shown_as_typed(run_dir: Path) -> None:
    rec = Recorder()
    app = FleetdeckApp(fleet(run_dir))
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        log = await open_log(pilot, app)
        await pilot.press("slash")
        await pilot.press(*"[bold]x[/", "enter")
        assert log.view is not None and log.view.search == "[bold]x[/"
        note = await until(pilot, lambda: next(
            (n for n in rec.notes if n.startswith("no line holds")), None), 60, "the note")
        # What the toast shows: its markup read as Textual reads it.
        assert to_content(note).plain == "no line holds '[bold]x[/'"
        assert not app.render_errors
