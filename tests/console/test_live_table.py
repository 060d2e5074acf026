"""LiveTable (console/tui/widgets/live_table.py) through Pilot: a changed cell is drawn again
and an unchanged one is not, a row out of view is not drawn until it comes into view, sort
order and the cursor survive updates, and a fitted column still fits. LiveTable reaches into
DataTable's private caches; these tests are what a Textual upgrade must pass."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from console.tui.widgets.live_table import LiveTable, Row, RowKeyedCache

ROWS = 100
SIZE = (60, 12)  # the header and ~10 rows in view


class Table(LiveTable):
    COLUMNS = (("name", "Name", None), ("a", "A", 8), ("b", "B", 8))


class TableApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.selected: list[str] = []

    def compose(self) -> ComposeResult:
        yield Table()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.selected.append(str(event.row_key.value))


def rows(**values: tuple[str, str]) -> dict[str, Row]:
    """r00..r99, each with a, b = "0", "0" unless given."""
    out: dict[str, Row] = {}
    for i in range(ROWS):
        key = f"r{i:02d}"
        a, b = values.get(key, ("0", "0"))
        out[key] = (Text(key, style="bold"), Text(a), Text(b, style="dim"))
    return out


def drawn_cells(table: Table) -> Counter[tuple[str, str]]:
    """(row, column) of every cell rendered from now on (a render fills the cell cache)."""
    seen: Counter[tuple[str, str]] = Counter()
    cache = table._cell_render_cache
    assert isinstance(cache, RowKeyedCache)
    put = cache.set

    def counting(key: Any, value: Any) -> None:
        row, column = key[0], key[1]
        assert isinstance(row, RowKey) and isinstance(column, ColumnKey), key  # the layout
        seen[(str(row.value), str(column.value))] += 1
        put(key, value)

    cache.set = counting  # type: ignore[method-assign]
    return seen


def line_text(table: Table, key: str) -> str:
    """The row's line as painted now (the table's content, scrolled)."""
    index = table.get_row_index(key)
    y = index - int(table.scroll_y) + (table.header_height if table.show_header else 0)
    return table.render_line(y).text


async def started(pilot: Any) -> Table:
    table = pilot.app.query_one(Table)
    table.sync(rows())
    await pilot.pause()
    await pilot.pause()
    table.refresh()  # drawn whole once more, after the resize the scroll bar made
    await pilot.pause()
    await pilot.pause()
    return table


async def test_a_changed_cell_is_drawn_again_and_the_rest_of_the_table_is_not() -> None:
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = await started(pilot)
        seen = drawn_cells(table)
        updates = table._update_count
        table.sync(rows(r03=("7", "0")))
        await pilot.pause()
        await pilot.pause()
        assert seen == Counter({("r03", "a"): 1}), seen
        assert "7" in line_text(table, "r03")
        assert table.get_cell("r03", "a").plain == "7"
        assert table._update_count == updates  # no full redraw was asked for
        # The same rows again: nothing is drawn.
        seen.clear()
        table.sync(rows(r03=("7", "0")))
        await pilot.pause()
        assert not seen, seen


async def test_a_row_out_of_view_is_drawn_only_when_it_comes_into_view() -> None:
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = await started(pilot)
        seen = drawn_cells(table)
        table.sync(rows(r80=("8", "8")))
        await pilot.pause()
        await pilot.pause()
        assert not seen, seen  # r80 is far below the window
        assert table.get_cell("r80", "a").plain == "8"
        table.move_cursor(row=80)
        await pilot.pause()
        await pilot.pause()
        assert seen[("r80", "a")] >= 1 and seen[("r80", "b")] >= 1, seen
        assert "8" in line_text(table, "r80")


async def test_sort_order_and_the_cursor_survive_updates() -> None:
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = await started(pilot)
        table.sync(rows(r05=("9", "0"), r06=("5", "0")))
        table.sort("a", key=lambda cell: int(cell.plain), reverse=True)
        await pilot.pause()
        assert [str(r.key.value) for r in table.ordered_rows[:2]] == ["r05", "r06"]
        table.move_cursor(row=1)
        await pilot.pause()
        assert table.selected_key == "r06"
        table.sync(rows(r05=("9", "1"), r06=("5", "1")))  # cells change, the order stays
        await pilot.pause()
        await pilot.pause()
        assert [str(r.key.value) for r in table.ordered_rows[:2]] == ["r05", "r06"]
        assert table.selected_key == "r06"
        assert "1" in line_text(table, "r06")
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == ["r06"]


async def test_a_fitted_column_widens_for_a_longer_cell_and_rows_come_and_go() -> None:
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = await started(pilot)
        width = table.columns[ColumnKey("name")].get_render_width(table)
        new = rows()
        new["r01"] = (Text("r01 with a long name", style="bold"), *new["r01"][1:])
        del new["r02"]
        new["r100"] = (Text("r100"), Text("1"), Text("1"))
        table.sync(new)
        await pilot.pause()
        await pilot.pause()
        assert table.columns[ColumnKey("name")].get_render_width(table) > width
        assert "r01 with a long name" in line_text(table, "r01")
        assert "r02" not in [str(k.value) for k in table.rows]
        assert table.row_count == ROWS
        assert table.get_cell("r100", "a").plain == "1"


async def test_forget_draws_every_row_in_view_again() -> None:
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = await started(pilot)
        seen = drawn_cells(table)
        table.forget()
        table.sync(rows())
        await pilot.pause()
        await pilot.pause()
        # Equal cells are written again (a theme change restyles them) and so drawn again.
        assert {row for row, _column in seen} >= {"r00", "r05"}, seen


def straight_and_rich(table: LiveTable) -> tuple[int, list[str]]:
    """Every cell in the table drawn straight (LiveTable._one_line) and Rich's way
    (DataTable._render_cell), with and without the cursor and the hover on it: how many
    were drawn straight, and each difference."""
    straight, differences = 0, []
    for row in range(table.row_count):
        style = table._get_row_style(row, table.rich_style)
        row_key = table._row_locations.get_key(row)
        for column, col in enumerate(table.ordered_columns):
            width = col.get_render_width(table)
            for cursor in (False, True):
                for hover in (False, True):
                    fast = table._one_line(row_key, col.key, row, column, style, width,
                                           cursor, hover)
                    if fast is None:
                        continue
                    straight += 1
                    table._cell_render_cache.clear()
                    rich = DataTable._render_cell(table, row, column, style, width, cursor,
                                                  hover)
                    if fast != rich:
                        differences.append(f"{row_key.value}/{col.key.value} cursor={cursor} "
                                           f"hover={hover}:\n {fast}\n {rich}")
    return straight, differences


async def test_a_one_line_cell_drawn_straight_is_drawn_as_rich_draws_it() -> None:
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = await started(pilot)
        cells: list[Any] = [
            Text(""), Text("", style="bold"), "plain", "", "[b]markup[/b]", ":smile:",
            Text("spans", style="dim"), Text.assemble(("  └ ", "dim"), ("gen-1", "bold"), " x"),
            Text("12345678"), Text("123456789"),  # fits exactly; one too long (Rich's way)
            Text("ends\n"), Text("a\tb"), Text("°C – ▁▃▅", style="italic red on blue"),
            Text("right", justify="right"), Text("6 wide 中文"),
        ]
        table.sync({f"c{i:02d}": (Text(f"c{i:02d}", style="bold"), cell, Text("x"))
                    for i, cell in enumerate(cells)})
        await pilot.pause()
        await pilot.pause()
        straight, differences = straight_and_rich(table)
        assert not differences, "\n".join(differences)
        assert straight >= 4 * 2 * len(cells), straight


async def test_the_fleet_and_gpu_tables_draw_straight_as_rich_does() -> None:
    from console.tui.app import FleetdeckApp
    from console.tui.screens.node import GenerateScreen
    from console.tui.widgets.fleet_table import FleetTable
    from console.tui.widgets.gpu_table import GpuTable
    from tests.console.test_snapshots import fed_app, feed, shown

    app = fed_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        assert isinstance(app, FleetdeckApp)
        fleet = app.query_one(FleetTable)
        straight, differences = straight_and_rich(fleet)
        assert not differences, "\n".join(differences)
        assert straight >= 4 * fleet.row_count * 9, straight
        await pilot.press("enter")
        await shown(pilot, GenerateScreen)
        gpus = app.screen.query_one(GpuTable)
        straight, differences = straight_and_rich(gpus)
        assert not differences, "\n".join(differences)
        assert straight >= 4 * gpus.row_count * 13, straight


async def test_a_row_given_as_a_function_is_built_only_in_view() -> None:
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = await started(pilot)
        built: list[str] = []

        def source(key: str, row: Row) -> Any:
            def build() -> Row:
                built.append(key)
                return row
            return build

        new = rows(r03=("3", "3"), r80=("8", "8"))
        table.sync({key: source(key, row) for key, row in new.items()})
        await pilot.pause()
        await pilot.pause()
        assert "r03" in built and "r80" not in built, built
        assert len(built) < 20, built  # the window and its margin, not the table
        assert "3" in line_text(table, "r03")
        assert table.get_cell("r80", "a").plain == "0"  # as last built
        table.move_cursor(row=80)  # scrolled into view: built as it is drawn
        await pilot.pause()
        await pilot.pause()
        assert "r80" in built
        assert table.get_cell("r80", "a").plain == "8"
        assert "8" in line_text(table, "r80")
        # Out of view again and changed again: the newest source is the one drawn.
        table.move_cursor(row=0)
        await pilot.pause()
        table.sync({key: source(key, row) for key, row in rows(r80=("9", "9")).items()})
        await pilot.pause()
        table.move_cursor(row=80)
        await pilot.pause()
        await pilot.pause()
        assert "9" in line_text(table, "r80")
