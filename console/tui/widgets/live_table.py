"""A DataTable kept in step with live rows: rows added and removed, and only the cells that
changed rendered again, and only the changed rows in view painted again.

Why it reaches into DataTable: `update_cell` bumps the table's update count, which keys every
one of its render caches, so one changed cell renders every row in view again, and it repaints
the whole widget. At 128 rows changing once a second that was most of the console's time. Here
a changed cell is written into the table's data without the bump; the cache entries of that
cell, its row and its line are dropped (the caches are replaced by ones that know their keys
by row), and only that row's region is refreshed, which Textual skips when it is out of view.
This uses DataTable's private `_data`, `_row_locations`, `_update_count` and four render
caches, and their key layouts; Textual is pinned exactly (pyproject.toml) and
tests/console/test_live_table.py fails if an upgrade changes them.

A cell that is one line of text and fits its column (every cell of the fleet and GPU tables,
as a rule) is drawn straight to segments: the same segments Rich's Padding, Textual's Styled
and Console.render_lines make of it (tests/console/test_live_table.py compares them), at a
tenth of their cost. Anything else goes Rich's way.

A row may be given as a function that builds it: it is built only when in view (or within
MARGIN rows of it); out of view it waits, its old line dropped from the caches, and is built
when it is next drawn (scrolled into view). Until then DataTable's data holds the row as last
built (DataTable's sort and get_cell see that).

Rows are one line high (add_row's default). Columns have fixed widths where they can: a
width change makes DataTable measure every cell again and render everything."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual._two_way_dict import TwoWayDict
from textual.cache import LRUCache
from textual.geometry import Region
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

Cell = Text | str
Row = tuple[Cell, ...]
RowSource = Row | Callable[[], Row]  # a function: built only in view

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

PRUNE_AT = 64  # keys kept per row before the ones the cache evicted are let go
MARGIN = 2  # rows beyond the window built anyway


def same(a: Cell, b: Cell) -> bool:
    """Equal text and style (Rich's Text equality ignores the base style)."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return a == b


class RowKeyedCache(LRUCache[K, V], Generic[K, V]):
    """DataTable's LRU render cache, also knowing its keys by the part of the key that names a
    row (a cell, a line), so that one row's entries can be dropped."""

    def __init__(self, maxsize: int, part: Callable[[K], Hashable]) -> None:
        super().__init__(maxsize)
        self._part = part
        self._by_part: dict[Hashable, set[K]] = {}

    def set(self, key: K, value: V) -> None:
        super().set(key, value)
        keys = self._by_part.setdefault(self._part(key), set())
        keys.add(key)
        if len(keys) > PRUNE_AT:  # a row the cursor crossed often: forget what LRU dropped
            keys.intersection_update(self.keys())

    def __setitem__(self, key: K, value: V) -> None:
        self.set(key, value)

    def clear(self) -> None:
        super().clear()
        self._by_part.clear()

    def drop(self, part: Hashable) -> None:
        for key in self._by_part.pop(part, ()):
            self.discard(key)


def _cell_part(key: tuple[Any, ...]) -> Hashable:
    return key[0], key[1]  # (row key, column key, styles...)


def _first_part(key: tuple[Any, ...]) -> Hashable:
    return key[0]  # the row key (row cache) or the line's y (line cache)


class LiveTable(DataTable[Cell]):
    # (key, label, width); width None: fit the content (for columns that rarely change)
    COLUMNS: ClassVar[Sequence[tuple[str, str, int | None]]] = ()

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id, classes=classes)
        self._rows: dict[str, Row] = {}
        # DataTable's own sizes; typed here as what they are, for drop()
        self._cells: RowKeyedCache[Any, Any] = RowKeyedCache(10000, _cell_part)
        self._row_lines: RowKeyedCache[Any, Any] = RowKeyedCache(1000, _first_part)
        self._lines: RowKeyedCache[Any, Any] = RowKeyedCache(1000, _first_part)
        self._cell_render_cache = self._cells
        self._row_render_cache = self._row_lines
        self._line_cache = self._lines
        self._fits = frozenset(key for key, _label, width in self.COLUMNS if width is None)
        self._pending: dict[str, Callable[[], Row]] = {}  # out of view, built when drawn

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    def sync(self, rows: Mapping[str, RowSource], ordered: bool = False) -> None:
        """Show `rows`; `ordered`: in the mapping's order (a sort), else new rows go last.
        The cursor stays on the row it was on, by key, wherever the row goes."""
        selected = self.selected_key
        for key in [k for k in self._rows if k not in rows]:
            self.remove_row(key)
            del self._rows[key]
            self._pending.pop(key, None)
        top = int(self.scroll_y) - MARGIN
        bottom = top + self.size.height + 2 * MARGIN  # the header's line is margin too
        locations = self._row_locations
        for key, source in rows.items():
            old = self._rows.get(key)
            if callable(source):
                index = locations.get(RowKey(key)) if old is not None else None
                if index is not None and not top <= index < bottom:
                    if key not in self._pending:  # its line as drawn must not be served
                        self._forget_lines(RowKey(key), index)
                    self._pending[key] = source
                    continue
                source = source()
            self._pending.pop(key, None)
            self._put(key, old, source)
        if ordered:
            self._arrange(list(rows))
        if selected is not None and selected in rows:
            index = self._row_locations.get(RowKey(selected))
            if index is not None and index != self.cursor_row:
                self.move_cursor(row=index, animate=False, scroll=False)

    def _put(self, key: str, old: Row | None, row: Row, repaint: bool = True) -> None:
        if old is None:
            self.add_row(*row, key=key)
        elif old is not row:
            self._update_row(key, old, row, repaint)
        self._rows[key] = row

    def _render_line_in_row(self, row_key: RowKey, line_no: int, base_style: Style,
                            cursor_location: Any, hover_location: Any) -> Any:
        """DataTable's, after building the row if it waited out of view."""
        if self._pending and row_key.value is not None:
            build = self._pending.pop(row_key.value, None)
            if build is not None:  # drawn now: no repaint asked for
                self._put(row_key.value, self._rows.get(row_key.value), build(), repaint=False)
        return super()._render_line_in_row(row_key, line_no, base_style, cursor_location,
                                           hover_location)

    def _update_row(self, key: str, old: Row, row: Row, repaint: bool = True) -> None:
        """Write the cells that changed; a fitted column's change goes the whole way (it may
        change the column's width, and so every row); the others drop their row's caches."""
        row_key = RowKey(key)
        data = self._data[row_key]
        changed = False
        for i, (col, _label, _width) in enumerate(self.COLUMNS):
            if old and same(row[i], old[i]):
                continue
            if col in self._fits:
                self.update_cell(key, col, row[i], update_width=True)
                continue
            column_key = ColumnKey(col)
            data[column_key] = row[i]
            self._cells.drop((row_key, column_key))
            changed = True
        if changed:
            index = self._row_locations.get(row_key)
            if index is not None:
                y = self._forget_lines(row_key, index)
                if repaint:  # DataTable's refresh_row, less its sum over the rows above
                    self._refresh_region(Region(0, y, max(self.size.width,
                                                          self.virtual_size.width), 1))

    def _forget_lines(self, row_key: RowKey, index: int) -> int:
        """Drop the row's drawn line from the caches; its y in the table."""
        y = index + (self.header_height if self.show_header else 0)  # rows are a line high
        self._row_renderable_cache.discard((self._update_count, index))
        self._row_lines.drop(row_key)
        self._lines.drop(y)
        return y

    def _render_cell(self, row_index: int, column_index: int, base_style: Style, width: int,
                     cursor: bool = False, hover: bool = False) -> list[list[Segment]]:
        """DataTable's, with a data cell that is one line of text drawn straight to segments,
        cached under DataTable's own key."""
        if row_index >= 0 and column_index >= 0 and not (self.fixed_rows or self.fixed_columns):
            row_key = self._row_locations.get_key(row_index)
            column_key = self._column_locations.get_key(column_index)
            key = (row_key, column_key, base_style, cursor, hover, self._show_hover_cursor,
                   self._update_count, self._pseudo_class_state)
            lines: list[list[Segment]] | None = self._cells.get(key)
            if lines is None and row_key is not None and column_key is not None:
                lines = self._one_line(row_key, column_key, row_index, column_index,
                                       base_style, width, cursor, hover)
                if lines is not None:
                    self._cells[key] = lines
            if lines is not None:
                return lines
        return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)

    def _one_line(self, row_key: RowKey, column_key: ColumnKey, row_index: int,
                  column_index: int, base_style: Style, width: int, cursor: bool,
                  hover: bool) -> list[list[Segment]] | None:
        """What Styled(Padding(cell, (0, pad)), pre, post) renders to at `width` and height
        1, for a cell of one line of text that fits; None for any other cell."""
        row = self.rows.get(row_key)
        if row is None or row.height != 1 or row.auto_height:
            return None
        cell = self._data[row_key].get(column_key)
        if isinstance(cell, str):
            if "[" in cell or ":" in cell:  # markup or an emoji code: Rich's way
                return None
            cell = Text(cell, end="")
        if not isinstance(cell, Text):
            return None
        plain = cell.plain
        pad = self.cell_padding
        inner = width - 2 * pad
        options = self.app.console_options
        if (not plain or "\n" in plain or "\t" in plain or len(plain) > inner
                or cell_len(plain) > inner
                or (cell.justify or options.justify or "default") != "default"):
            return None
        component, post = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css")
        pre = base_style + Style.from_meta({"row": row_index, "column": column_index}) \
            + component

        def styled(style: Style | None) -> Style | None:  # Segment.apply_style's rule
            if pre:
                style = pre + style
            if post:
                style = style + post if style else post
            return style

        blank = styled(Style.null())
        line = [Segment(" " * pad, blank)] if pad else []
        # Text("\n").join of the one line, as Text.__rich_console__ renders it (an empty cell
        # renders an empty segment too: left to Rich)
        spans = [Span(0, len(plain), cell.style)] if cell.style else []
        spans += cell.spans
        parts = Text(plain, spans=spans).render(self.app.console) if spans \
            else [Segment(plain)]
        line += [Segment(part.text, styled(part.style)) for part in parts if part.text]
        fill = inner - cell_len(plain)
        if fill:
            line.append(Segment(" " * fill, blank))
        if pad:
            line.append(Segment(" " * pad, blank))
        return [line]

    def _arrange(self, order: Sequence[str]) -> None:
        """Put the rows in `order` (every key of the sync). Only the rows that moved are drawn
        again: DataTable's sort bumps the update count and so draws every row, which at a
        fleet sorted by rate (most rows move on most ticks) doubled a tick's cost. A moved
        row's cells are dropped too: their segments carry the row's index (for clicks) and its
        stripe."""
        locations = self._row_locations
        moved = [(RowKey(key), i) for i, key in enumerate(order)
                 if locations.get(RowKey(key)) != i]
        if not moved:
            return
        for row_key, _i in moved:  # the lines where they were drawn
            index = locations.get(row_key)
            if index is not None:
                self._forget_lines(row_key, index)
        self._row_locations = TwoWayDict({RowKey(key): i for i, key in enumerate(order)})
        self._offset_cache.clear()  # y -> row key, and the rows in order: keyed by the count
        self._ordered_row_cache.clear()
        width = max(self.size.width, self.virtual_size.width)
        for row_key, index in moved:
            y = self._forget_lines(row_key, index)
            for column_key in self.columns:
                self._cells.drop((row_key, column_key))
            self._refresh_region(Region(0, y, width, 1))

    def forget(self) -> None:
        """Redraw every cell next time (after a theme change)."""
        self._rows = {k: () for k in self._rows}

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None
