"""Alerts reach someone not watching (bell, notification, the configured command with the
alert as JSON on stdin); keys remap from the fleet file; themes come from the config and
cycle. No node is needed: snapshots are fed to the app."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from tests.console import data as d
from tests.console.conftest import until
from tests.console.screen import Recorder, screen_text


def one_node(**console: Any) -> Fleet:
    return Fleet(nodes=[Node(name="gen-1", run_dir="/r", host="h")],
                 console=ConsoleSettings(**console), source="fleet.toml")


async def test_new_alert_rings_notifies_and_runs_the_command(tmp_path: Path) -> None:
    out = tmp_path / "alert.json"
    app = FleetdeckApp(one_node(alert_command=f"cat > {shlex.quote(str(out))}"),
                       connect=False)
    rings: list[int] = []
    app.bell = lambda: rings.append(1)  # type: ignore[method-assign]
    rec = Recorder()
    async with app.run_test(message_hook=rec) as pilot:
        app.ingest("gen-1", d.generate_snapshot(alerts=[]))
        await pilot.pause()
        assert not rings
        app.ingest("gen-1", d.generate_snapshot())  # server_restarts appears
        await until(pilot, lambda: out.exists() and out.read_text().endswith("\n"), 60,
                    "the alert command's stdin")
        got = json.loads(out.read_text())
        assert got["node"] == "gen-1"
        assert got["alert"]["code"] == "server_restarts"
        assert got["alert"]["server"] == 3
        assert rings == [1]
        assert rec.has("server 3 restarted 2 times")
        # The same alert again is not new: no second bell.
        app.ingest("gen-1", d.generate_snapshot())
        await pilot.pause()
        assert rings == [1]


async def test_a_failing_alert_command_is_a_notification(tmp_path: Path) -> None:
    app = FleetdeckApp(one_node(alert_command="echo nope >&2; exit 3", bell=False),
                       connect=False)
    rec = Recorder()
    async with app.run_test(message_hook=rec) as pilot:
        app.ingest("gen-1", d.generate_snapshot())
        await until(pilot, lambda: rec.has("exited 3: nope"), 60, "the command's failure")
        assert app.is_running


async def test_keymap_from_the_fleet_file_and_unknown_ids() -> None:
    rec = Recorder()
    app = FleetdeckApp(one_node(keymap={"pause": "z", "no_such_action": "q"}), connect=False)
    async with app.run_test(size=(200, 20), message_hook=rec) as pilot:
        await pilot.pause()
        keys = app.screen.active_bindings
        assert keys["z"].binding.id == "pause"
        assert "p" not in keys
        assert keys["s"].binding.id == "stop"
        assert rec.has("no_such_action")
        # The footer shows the remapped key (once it has drawn: a loaded machine is slow).
        await until(pilot, lambda: "z Pause" in screen_text(app))


async def test_theme_from_config_and_cycling() -> None:
    rec = Recorder()
    app = FleetdeckApp(one_node(theme="fleetdeck-light"), connect=False)
    async with app.run_test(message_hook=rec) as pilot:
        await pilot.pause()
        assert app.theme == "fleetdeck-light"
        await pilot.press("t")
        assert app.theme == "fleetdeck-high-contrast"
        await pilot.press("t")
        assert app.theme == "fleetdeck-dark"
    app = FleetdeckApp(one_node(theme="no-such-theme"), connect=False)
    rec = Recorder()
    async with app.run_test(message_hook=rec) as pilot:
        await pilot.pause()
        assert app.theme == "fleetdeck-dark"
        assert rec.has("'no-such-theme' is not a theme")


async def test_stale_figures_show_their_age() -> None:
    now = [d.NOW]
    app = FleetdeckApp(one_node(bell=False), connect=False, clock=lambda: now[0])
    async with app.run_test(size=(160, 30)) as pilot:
        app.ingest("gen-1", d.generate_snapshot())
        app.state.set_link("gen-1", "connected", None)
        app.state.nodes["gen-1"].received_at = d.NOW
        app.redraw()
        await pilot.pause()
        assert "reconnecting" not in screen_text(app)
        now[0] = d.NOW + 75
        app.state.set_link("gen-1", "reconnecting", "connection lost")
        await until(pilot, lambda: "reconnecting 75 s" in screen_text(app), 60,
                    "the age beside the link state")
        await pilot.press("enter")
        await until(pilot, lambda: "figures 75 s old" in screen_text(app), 60,
                    "the node screen's age")


async def test_actions_without_a_link_report_an_error() -> None:
    rec = Recorder()
    app = FleetdeckApp(one_node(bell=False), connect=False)
    async with app.run_test(message_hook=rec) as pilot:
        app.ingest("gen-1", d.generate_snapshot())
        await until(pilot, lambda: "qwen-traces" in screen_text(app), 60, "the node's row")
        await pilot.press("p")
        await until(pilot, lambda: rec.has("Pause failed: gen-1 is not connected"), 60,
                    "the error as a notification")
        assert app.is_running


async def test_a_tick_or_a_look_at_the_screen_while_closing_is_harmless() -> None:
    """The redraw timer can fire while the app closes, with no screen on the stack; it used to
    raise ScreenStackError and fail the run (CI saw it in the test above)."""
    app = FleetdeckApp(one_node(bell=False), connect=False)
    async with app.run_test() as pilot:
        app.ingest("gen-1", d.generate_snapshot())
        await until(pilot, lambda: "qwen-traces" in screen_text(app), 60, "the node's row")
        assert app.shown is not None
    assert app.shown is None
    app.state.version += 1
    app._tick()
    app.redraw()
    assert app.current_node() is None and app.current_campaign() is None


async def test_an_alert_the_node_paged_is_not_paged_again(tmp_path: Path) -> None:
    """[alerts] webhook on the node: its alerts come marked `paged`; the console still shows
    them but runs the alert command only for the others."""
    out = tmp_path / "alerts.jsonl"
    app = FleetdeckApp(one_node(alert_command=f"cat >> {shlex.quote(str(out))}", bell=False),
                       connect=False)
    rec = Recorder()
    paged = {"code": "stall", "severity": "critical", "message": "no completion for 11 min",
             "since": d.NOW - 60, "paged": True}
    unpaged = {"code": "disk_full", "severity": "critical", "message": "disk full in 2.0 h",
               "since": d.NOW - 30}
    async with app.run_test(message_hook=rec) as pilot:
        app.ingest("gen-1", d.generate_snapshot(alerts=[paged]))
        await until(pilot, lambda: rec.has("no completion for 11 min"), 60, "shown")
        # A later alert the node did not page (an older agent, or no webhook) still runs it:
        # the command works, so the paged one's absence is the skip.
        app.ingest("gen-1", d.generate_snapshot(alerts=[paged, unpaged]))
        await until(pilot, lambda: out.exists() and out.read_text().endswith("\n"), 60,
                    "the alert command's stdin")
        await until(pilot, lambda: not [w for w in app.workers if w.name == "alert-command"
                                        and not w.is_finished], 60, "commands done")
        got = [json.loads(line)["alert"]["code"] for line in out.read_text().splitlines()]
        assert got == ["disk_full"]
