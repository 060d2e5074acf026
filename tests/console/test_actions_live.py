"""Every action end to end against a live supervised run on simulated GPUs: press the key,
answer the modal, the agent applies it, and the screen shows the new value. The tests share
one run and go in file order (the last one takes it down)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from textual.widgets import Input

from agents.supervise.procinfo import alive
from console.fleet import Node
from console.tui.app import FleetdeckApp
from console.tui.screens.node import GenerateScreen
from console.tui.widgets.confirm import ChoiceModal, ConfirmModal
from console.tui.widgets.log_pane import LogPane
from console.tui.widgets.prompt import ValueModal
from tests.console.conftest import LiveRun, on_screen, palette_search, until
from tests.console.screen import Recorder, progress, screen_text, server, snapshot
from tests.servers.sshd import SshServer

SIZE = (160, 48)


async def open_node(pilot: Any, app: FleetdeckApp) -> GenerateScreen:
    await until(pilot, lambda: progress(app) is not None and progress(app).status == "running"
                and len(snapshot(app).servers) == 2, 180, "a running snapshot")
    await pilot.press("enter")
    screen = await until(pilot, lambda: on_screen(app, GenerateScreen), 120, "the node screen")
    assert isinstance(screen, GenerateScreen)
    return screen


async def answer_value(pilot: Any, app: FleetdeckApp, text: str) -> None:
    modal = await until(pilot, lambda: on_screen(app, ValueModal), 120, "the value prompt")
    field = modal.query_one(Input)
    assert field.has_focus
    await pilot.press(*text)  # the current value is selected: typing replaces it
    assert field.value == text


async def confirm(pilot: Any, app: FleetdeckApp, question: str) -> None:
    modal = await until(pilot, lambda: on_screen(app, ConfirmModal), 120, "the confirmation")
    assert question in modal.question
    await pilot.press("y")


async def test_live_controls(live_run: LiveRun) -> None:
    rec = Recorder()
    app = FleetdeckApp(live_run.fleet())
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await open_node(pilot, app)
        # The sparklines' past comes from the `history` RPC, fetched on opening the node.
        await until(pilot, lambda: app.fetched["sim-1"].history.loaded, 120, "history fetched")

        await pilot.press("p")
        await until(pilot, lambda: progress(app).paused and "PAUSED" in screen_text(app),
                    120, "paused on screen")
        await until(pilot, lambda: rec.has("sim-1: paused"), 120, "the pause reported")
        await pilot.press("P")
        await until(pilot, lambda: not progress(app).paused
                    and "PAUSED" not in screen_text(app), 120, "unpaused")

        # Resize every server through the prompt, then +/- by one.
        await pilot.press("c")
        await answer_value(pilot, app, "6")
        await pilot.press("enter")
        await until(pilot, lambda: progress(app).concurrency == 6
                    and "concurrency 6 " in screen_text(app), 120, "concurrency 6 on screen")
        await pilot.press("plus")
        await until(pilot, lambda: progress(app).concurrency == 7, 120, "concurrency 7")
        await pilot.press("minus")
        await until(pilot, lambda: progress(app).concurrency == 6, 120, "back to 6")

        # One server only: the selected GPU row (server 1).
        await pilot.press("down")
        await pilot.press("c")
        await answer_value(pilot, app, "3")
        await pilot.press("tab", "space", "shift+tab", "enter")
        await until(pilot, lambda: server(app, 1).limit == 3 and server(app, 0).limit == 6
                    and "/3 " in screen_text(app), 120, "server 1 limited to 3")

        # Max tokens: the prompt shows the truncation rate beside it.
        await pilot.press("m")
        modal = await until(pilot, lambda: on_screen(app, ValueModal), 120, "the max tokens prompt")
        assert "truncated" in str(modal.note)
        await answer_value(pilot, app, "200")
        await pilot.press("enter")
        await until(pilot, lambda: progress(app).max_tokens == 200
                    and "max_tokens 200 " in screen_text(app), 120, "max_tokens 200 shown")

        # Retry truncated: a choice, then the engine applies a new control revision.
        rev = progress(app).control_rev
        await pilot.press("R")
        await until(pilot, lambda: on_screen(app, ChoiceModal), 120, "retry choice")
        await pilot.press("t")
        await until(pilot, lambda: progress(app).control_rev > rev
                    and f"rev {progress(app).control_rev}" in screen_text(app), 120,
                    "a new control rev")
        await until(pilot, lambda: rec.has("retry truncated"), 120, "the retry reported")
        # Long only: the loops left out, its own counter in control.json, applied once.
        rev = progress(app).control_rev
        await pilot.press("R")
        await until(pilot, lambda: on_screen(app, ChoiceModal), 120, "retry choice again")
        await pilot.press("l")
        await until(pilot, lambda: progress(app).control_rev > rev, 120, "long-only applied")
        await until(pilot, lambda: rec.has("retry truncated --long-only"), 120,
                    "the long-only retry reported")
        control = json.loads((live_run.run_dir / "control.json").read_text())
        assert control["retry"] == {"failed": 0, "truncated": 1, "long": 1}

        # Logs and samples fill their panes.
        await pilot.press("l")
        await until(pilot, lambda: len(app.screen.query_one(LogPane).lines) > 0
                    and "generate" in screen_text(app), 120, "the log tail")
        await pilot.press("S")
        await until(pilot, lambda: app.fetched["sim-1"].samples, 120, "samples fetched")
        first = app.fetched["sim-1"].samples[0]
        await until(pilot, lambda: f"#{first['index']}  {first['finish_reason']}"
                    in screen_text(app) and " answer " in screen_text(app), 120,
                    "a completion readable in the samples pane")
        assert not app.render_errors


async def test_restart_stop_resume(live_run: LiveRun) -> None:
    rec = Recorder()
    app = FleetdeckApp(live_run.fleet())
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        screen = await open_node(pilot, app)
        before = server(app, 1).restarts
        screen.gpu_table.focus()
        await pilot.press("down")
        await pilot.press("x")
        await confirm(pilot, app, "Restart server 1")
        await until(pilot, lambda: server(app, 1).restarts > before, 180, "a restart counted")
        await until(pilot, lambda: server(app, 1).state == "healthy", 180, "server 1 back")

        await pilot.press("s")
        await confirm(pilot, app, "Stop the job")
        await until(pilot, lambda: snapshot(app).status == "stopped"
                    and "stopped" in screen_text(app), 180, "stopped on screen")
        # The agent's refusal is a notification, not a crash.
        await pilot.press("s")
        await confirm(pilot, app, "Stop the job")
        await until(pilot, lambda: rec.has("Stop refused: no job is running"), 120,
                    "the agent's error shown")
        await pilot.press("r")
        await until(pilot, lambda: snapshot(app).status == "running", 180, "running again")
        await until(pilot, lambda: rec.has("resume:"), 120, "the resume reported")
        assert not app.render_errors


async def test_read_only(live_run: LiveRun) -> None:
    app = FleetdeckApp(live_run.fleet(), read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await open_node(pilot, app)
        keys = set(app.screen.active_bindings)
        assert {"p", "c", "l"} <= keys
        assert not {"s", "D", "x", "L"} & keys
        for key in ("s", "D", "x", "L"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, GenerateScreen), key
        assert "READ-ONLY" in screen_text(app)
        assert snapshot(app).status == "running"
        assert "Stop" not in await palette_titles(pilot, app, "Stop")
        assert "Down" not in await palette_titles(pilot, app, "Down")
        assert "Pause" in await palette_titles(pilot, app, "Pause")


async def palette_titles(pilot: Any, app: FleetdeckApp, query: str) -> str:
    """The command palette's results for a query, as text, once its search has ended."""
    from textual.command import CommandList, CommandPalette

    palette = await palette_search(pilot, query)
    results = palette.query_one(CommandList)
    text = "\n".join(str(results.get_option_at_index(i).prompt)
                     for i in range(results.option_count))
    await pilot.press("escape")
    await until(pilot, lambda: not isinstance(app.screen, CommandPalette), 120, "palette closed")
    return text


async def test_a_hung_node_never_stalls_the_live_one(live_run: LiveRun, sshd: SshServer,
                                                      tmp_path: Path) -> None:
    """A node whose sshd is SIGSTOPped (the port accepts, nothing answers) beside the live
    one: the live node's figures keep moving on screen while the hung one says so."""
    fleet = live_run.fleet()
    fleet.nodes.append(Node(name="hung", run_dir=str(tmp_path), host=sshd.host,
                            port=sshd.port, user=sshd.user, identity_file=str(sshd.client_key),
                            known_hosts=str(sshd.known_hosts), connect_timeout_s=3))
    sshd.freeze()
    try:
        app = FleetdeckApp(fleet)
        async with app.run_test(size=SIZE) as pilot:
            def live_row() -> str:
                """The live node's Progress cell as drawn, e.g. `12.3% 2.5k/20.0k`."""
                line = next((line for line in screen_text(app).splitlines()
                             if " sim-1 " in line), "")
                found = re.search(r"\d+\.\d% \S+", line)
                return found.group(0) if found else ""

            await until(pilot, lambda: progress(app) is not None and live_row(),
                        120, "the live node's row")
            first, row = progress(app).completed, live_row()
            await until(pilot, lambda: app.state.nodes["hung"].link == "unreachable"
                        and "unreachable" in screen_text(app), 180, "the hung node shown")
            await until(pilot, lambda: progress(app).completed > first and live_row() != row,
                        120, "the live node's row moving meanwhile")
    finally:
        sshd.thaw()


async def test_pull_and_decommission_check(live_run: LiveRun, tmp_path: Path) -> None:
    from textual.widgets import Label, Static

    from console.tui.screens.decommission import DecommissionScreen

    pulls = tmp_path / "pulls"
    app = FleetdeckApp(live_run.fleet(pull_dir=str(pulls)))
    async with app.run_test(size=SIZE) as pilot:
        await open_node(pilot, app)
        await pilot.press("u")
        screen = await until(pilot, lambda: on_screen(app, DecommissionScreen),
                             120, "the decommission screen")
        assert isinstance(screen, DecommissionScreen)
        label = screen.query_one("#pull-label", Label)
        await until(pilot, lambda: str(label.render()).startswith("pulled:"), 180, "the pull")
        assert (pulls / "sim-1" / "tui-test" / "run.toml").exists()
        items = screen.query_one("#items", Static)
        await until(pilot, lambda: "run finished" in str(items.render()), 180, "the checklist")
        assert "✗ run finished" in str(items.render())  # the run is live: not safe
        assert "NOT safe" in str(screen.query_one("#verdict", Label).render())
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DecommissionScreen), 120, "closed")


async def test_down(live_run: LiveRun) -> None:
    rec = Recorder()
    app = FleetdeckApp(live_run.fleet())
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await open_node(pilot, app)
        pid = live_run.pids()[0]
        assert "Down" in await palette_titles(pilot, app, "Down")
        await pilot.press("D")
        await confirm(pilot, app, "Take sim-1 down")
        await until(pilot, lambda: rec.has("down:"), 120, "down acknowledged")
        await until(pilot, lambda: not alive(pid), 180, "the supervisor gone")
