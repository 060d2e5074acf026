"""The command palette's actions, built from the same registry as the key bindings (so
`--read-only` removes dangerous ones from both), plus the fleetdeck themes; and a screen's
own keys that the footer has no room for (the fleet view's sort and filter)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

from console.actions import visible
from console.tui.port import PalettePort
from console.tui.widgets.keys import key_for
from themes.palette import NAMES


def markup_text(text: str) -> str:
    """`text` shown as is where Textual reads markup (the palette's help): every bracket
    escaped, since textual.markup.escape leaves `[P]` to be read as a tag."""
    return text.replace("[", "\\[")


class _Listed(Provider):
    """A provider whose commands are a list of (title, help, run), offered and searched."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        raise NotImplementedError

    async def discover(self) -> Hits:
        for title, help_text, run in self._commands():
            yield DiscoveryHit(title, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, run in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), run, help=help_text)


class ActionCommands(_Listed):
    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        app = self.app
        if not isinstance(app, PalettePort):
            raise TypeError(f"the fleetdeck palette needs a PalettePort app, not "
                            f"{type(app).__name__}")
        out: list[tuple[str, str, Callable[[], object]]] = []
        for a in visible(app.read_only):
            help_text = f"{a.description}  {markup_text(f'[{app.key_for(a.id)}]')}" + \
                ("  (asks first)" if a.dangerous else "")
            out.append((a.title, help_text, partial(app.perform, a.id)))
        for name in NAMES:
            out.append((f"Theme: {name}", "switch the colour theme",
                        partial(app.use_theme, name)))
        return out



class ScreenCommands(_Listed):
    """The bindings the screen declares itself, each named with the key it answers to now."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        screen = self.screen
        out: list[tuple[str, str, Callable[[], object]]] = []
        for b in Binding.make_bindings(type(screen).__dict__.get("BINDINGS", ())):
            if b.id is None:
                continue
            help_text = f"{b.tooltip or b.description}  {markup_text(f'[{key_for(screen, b.id)}]')}"
            out.append((b.description, help_text, partial(self.app.run_action, b.action, screen)))
        return out

