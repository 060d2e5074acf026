"""SteadyBar (console/tui/widgets/steady_bar.py) through Pilot: one progress value draws the same
whether it came before the bar's first layout, while the bar was hidden, or after. Textual's
`Bar` rounds a value to the half cells of the width it has when the value is set, and keeps it
exact when it has none yet: the generation screen's snapshot drew its last glyph two ways."""

from __future__ import annotations

from rich.console import Console
from textual.app import App, ComposeResult
from textual.widgets._progress_bar import Bar

from console.tui.widgets.steady_bar import SteadyBar
from tests.console.conftest import until

DONE, TOTAL = 493.77, 1000


class Bars(App[None]):
    def compose(self) -> ComposeResult:
        for name in ("early", "hidden", "late"):
            yield SteadyBar(total=None, show_eta=False, id=name)

    def on_mount(self) -> None:
        # Before the first layout: no widget has a size yet.
        self.query_one("#early", SteadyBar).update(total=TOTAL, progress=DONE)
        hidden = self.query_one("#hidden", SteadyBar)
        hidden.display = False
        hidden.update(total=TOTAL, progress=DONE)


def drawn(bar: SteadyBar) -> str:
    inner = bar.query_one(Bar)
    console = Console(width=inner.size.width, color_system=None, legacy_windows=False)
    with console.capture() as out:
        console.print(inner.render(), end="")
    return out.get()


async def test_a_value_draws_the_same_before_and_after_layout() -> None:
    app = Bars()
    async with app.run_test(size=(100, 10)) as pilot:
        late = app.query_one("#late", SteadyBar)
        await until(pilot, lambda: late.query_one(Bar).size.width > 0, 60, "the bars laid out")
        late.update(total=TOTAL, progress=DONE)
        hidden = app.query_one("#hidden", SteadyBar)
        hidden.display = True
        await until(pilot, lambda: hidden.query_one(Bar).size.width > 0, 60, "the bar shown")
        await pilot.pause()
        early = app.query_one("#early", SteadyBar)
        width = late.query_one(Bar).size.width * 2
        rounded = int(DONE / TOTAL * width) / width
        assert rounded != DONE / TOTAL  # the value falls between two half cells
        for bar in (early, hidden, late):
            assert bar.query_one(Bar).percentage == rounded, bar.id
        assert drawn(early) == drawn(hidden) == drawn(late)
        assert drawn(late).strip()  # something was drawn
