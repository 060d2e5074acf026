"""LiveStatic (console/tui/widgets/live_static.py) through Pilot: drawn only when its text
changed, and laid out only when its height changed."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult

from console.tui.widgets.live_static import LiveStatic


class LineApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LiveStatic(id="line")


async def test_a_live_static_lays_out_only_when_its_height_changes() -> None:
    app = LineApp()
    async with app.run_test(size=(60, 12)) as pilot:
        line = app.query_one("#line", LiveStatic)
        calls: list[bool] = []
        refresh = line.refresh

        def spy(*regions: Any, **kw: Any) -> Any:
            calls.append(bool(kw.get("layout")))
            return refresh(*regions, **kw)

        line.draw(Text("rate 1.2/s"))
        await pilot.pause()
        line.refresh = spy  # type: ignore[method-assign]
        line.draw(Text("rate 1.2/s"))  # as drawn: nothing
        assert calls == []
        line.draw(Text("rate 3.4/s"))  # same words' widths: a repaint, no layout
        assert calls == [False]
        line.draw(Text("rate 3.4/s", style="bold"))  # a style: a repaint
        assert calls == [False, False]
        line.draw(Text("rate 12.4/s"))  # a wider word, still one line: measured, no layout
        assert calls == [False, False, False]
        line.draw(Text("rate 12.4/s\nand a second line"))  # taller: a layout
        assert calls == [False, False, False, False, True]
        await pilot.pause()
        assert line.size.height == 2
        assert "and a second line" in str(line.render())
        wide = "word " * 30  # wraps at 60 columns: taller
        line.draw(Text(wide.strip()))
        assert calls[-1] is True
        await pilot.pause()
        assert line.size.height > 1
