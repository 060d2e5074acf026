"""Every key is a Binding with a snake_case id that [console.keymap] can move, modals
included; old ids still work, with a warning naming old and new; unknown ids are named with
the fleet file; hints and buttons name the keys actually bound; every registry action has a
handler; no CSS outside themes/. No node is needed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.dom import DOMNode
from textual.widgets import Button, Label

import console.tui
from console.actions import ACTIONS, BY_ID
from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import KEYMAP_OWNERS, FleetdeckApp
from console.tui.handlers import NAVIGATION, Controls
from console.tui.keymap import ALIASES, ID_STYLE, binding_ids, resolve
from console.tui.replay import REPLAY_KEYMAP_OWNERS
from console.tui.screens.decommission import DecommissionScreen
from console.tui.screens.fleet import FleetScreen
from console.tui.widgets.confirm import ConfirmModal
from console.tui.widgets.keys import mnemonic
from console.tui.widgets.retry import RetryModal
from tests.console import data as d
from tests.console.conftest import on_screen, until
from tests.console.screen import Recorder, screen_text


def tui_classes() -> list[type[DOMNode]]:
    """Every app, screen and widget class defined under console/tui."""
    found: dict[str, type[DOMNode]] = {}
    for info in pkgutil.walk_packages(console.tui.__path__, "console.tui."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, DOMNode) and cls.__module__ == info.name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


def own_bindings(cls: type[DOMNode]) -> list[Binding]:
    return list(Binding.make_bindings(cls.__dict__.get("BINDINGS", ())))


def one_node(**console: Any) -> Fleet:
    return Fleet(nodes=[Node(name="gen-1", run_dir="/r", host="h")],
                 console=ConsoleSettings(**console), source="fleet.toml")


def test_every_binding_has_an_id_in_the_one_style() -> None:
    classes = tui_classes()
    assert FleetdeckApp in classes and ConfirmModal in classes
    seen = 0
    for cls in classes:
        for b in own_bindings(cls):
            seen += 1
            where = f"{cls.__module__}.{cls.__qualname__}: {b.key} -> {b.action}"
            assert b.id is not None, f"{where} has no id, so no keymap can move it"
            assert ID_STYLE.fullmatch(b.id), f"{where}: id {b.id!r} is not snake_case"
    assert seen > len(ACTIONS)


def test_the_keymap_reaches_every_class_with_bindings() -> None:
    declaring = {cls for cls in tui_classes() if own_bindings(cls)}
    # A replay's app moves its own keys too (console/tui/replay.py); the rest is the app's.
    missing = sorted(c.__qualname__ for c in declaring - set(REPLAY_KEYMAP_OWNERS))
    assert set(KEYMAP_OWNERS) <= set(REPLAY_KEYMAP_OWNERS)
    assert not missing, f"bindings the keymap cannot move: {missing} (add to KEYMAP_OWNERS)"
    known = binding_ids(KEYMAP_OWNERS)
    assert {"confirm_yes", "confirm_no", "prompt_cancel", "choice_cancel", "retry_failed",
            "retry_truncated", "retry_long", "decommission_pull", "decommission_check",
            "decommission_close", "back", "quit"} <= set(known)
    assert set(ALIASES.values()) <= set(known)


def test_app_binding_ids_are_the_registry_ids() -> None:
    ids = {b.id for b in own_bindings(FleetdeckApp)}
    assert ids - {"back", "quit"} == set(BY_ID)


def test_every_registry_action_has_a_handler() -> None:
    assert set(BY_ID) >= NAVIGATION
    for a in ACTIONS:
        if a.id in NAVIGATION:
            continue
        handler = getattr(Controls, a.id, None)
        assert inspect.iscoroutinefunction(handler), \
            f"action {a.id!r} has no handler: Controls.{a.id} (or add it to NAVIGATION)"


async def test_every_navigation_action_is_handled() -> None:
    app = FleetdeckApp(one_node(bell=False), connect=False, clock=lambda: d.NOW)
    async with app.run_test() as pilot:
        app.ingest("gen-1", d.generate_snapshot())
        await pilot.pause()
        for action_id in sorted(NAVIGATION):
            await app.navigate(action_id)  # raises for an id it does not handle
            await pilot.pause()
        assert app.theme == "fleetdeck-light"  # theme cycled once from the default
        assert not app.render_errors


def test_keymap_aliases_and_unknown_ids_are_named() -> None:
    known = {"confirm_yes": "y", "confirm_no": "n,escape", "pause": "p"}
    got = resolve({"confirm.yes": "j", "pause": "z", "nope": "q"}, known, "my/fleet.toml")
    assert got.keys == {"confirm_yes": "j", "pause": "z"}
    assert any("my/fleet.toml" in w and "confirm.yes" in w and "confirm_yes" in w
               for w in got.warnings)
    assert any("my/fleet.toml" in w and "nope" in w for w in got.warnings)
    both = resolve({"confirm.yes": "j", "confirm_yes": "k"}, known, "f.toml")
    assert both.keys == {"confirm_yes": "k"}
    assert any("both" in w and "confirm.yes" in w for w in both.warnings)
    assert resolve({"pause": "z"}, known, "f.toml").warnings == []


def test_mnemonic_labels() -> None:
    assert mnemonic("Yes", "y") == "[u]Y[/u]es"
    assert mnemonic("No", "n") == "[u]N[/u]o"
    assert mnemonic("Yes", "j") == "Yes (j)"
    assert mnemonic("No", "esc") == "No (esc)"


async def test_a_modal_binding_remapped_and_an_old_id_still_works() -> None:
    rec = Recorder()
    app = FleetdeckApp(one_node(bell=False, keymap={"confirm.yes": "j", "retry_failed": "g"}),
                       connect=False)
    answers: list[Any] = []
    async with app.run_test(message_hook=rec) as pilot:
        await pilot.pause()
        assert rec.has("fleet.toml: [console.keymap] confirm.yes is now called confirm_yes")
        await app.push_screen(ConfirmModal("Really?"), answers.append)
        assert str(app.screen.query_one("#yes", Button).label) == "Yes (j)"
        await pilot.press("y")  # no longer the key
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal) and answers == []
        await pilot.press("j")
        await until(pilot, lambda: answers == [True], 60, "yes on the remapped key")

        await app.push_screen(RetryModal("gen-1"), answers.append)
        labels = [str(b.label) for b in app.screen.query(Button)]
        assert labels == ["g failed", "t truncated", "l long only (not loops)", "Cancel"]
        await pilot.press("f")  # the old raw key does nothing now
        await pilot.pause()
        assert isinstance(app.screen, RetryModal)
        await pilot.press("g")
        await until(pilot, lambda: answers[-1] == "failed", 60, "failed on the remapped key")
        await app.push_screen(RetryModal("gen-1"), answers.append)
        await pilot.press("l")  # truncated, leaving out the loops
        await until(pilot, lambda: answers[-1] == "long", 60, "long only")
        await app.push_screen(RetryModal("gen-1"), answers.append)
        await pilot.press("escape")
        await until(pilot, lambda: answers[-1] is None and len(answers) == 4, 60, "cancel")


async def test_hints_name_the_users_keys() -> None:
    app = FleetdeckApp(one_node(bell=False, keymap={"decommission_pull": "U", "logs": "o",
                                                    "decommission_close": "ctrl+w"}),
                       connect=False, clock=lambda: d.NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        app.ingest("gen-1", d.generate_snapshot())
        await pilot.pause()
        screen = DecommissionScreen(app.fleet.node("gen-1"), Path("/tmp/pulls"), lambda: None)
        await app.push_screen(screen)
        await until(pilot, lambda: "gen-1 is not connected" in screen_text(app), 60,
                    "the check refused without a link")
        hint = str(screen.query(Label).last().render())
        assert hint == "U pull what is missing · r check again · ^w close"
        await pilot.press("ctrl+w")
        await until(pilot, lambda: on_screen(app, FleetScreen), 60, "closed")
        await pilot.press("enter")
        await until(pilot, lambda: "press o for the log tail" in str(
            app.screen.query_one("#log-title", Label).render()), 60, "the log hint")


def test_no_inline_css_outside_themes() -> None:
    for cls in tui_classes():
        for attr in ("DEFAULT_CSS", "CSS"):
            css = cls.__dict__.get(attr)
            assert not css, f"{cls.__module__}.{cls.__qualname__}.{attr}: move it to themes/*.tcss"


async def test_the_palette_names_the_remapped_key() -> None:
    from textual.command import CommandList, CommandPalette

    app = FleetdeckApp(one_node(bell=False, keymap={"pause": "z"}), connect=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("ctrl+p")
        palette = await until(pilot, lambda: on_screen(app, CommandPalette), 60, "the palette")
        await pilot.press(*"pause")
        results = palette.query_one(CommandList)
        await until(pilot, lambda: any("[z]" in str(results.get_option_at_index(i).prompt)
                                       for i in range(results.option_count)), 60,
                    "the pause hit naming z")
