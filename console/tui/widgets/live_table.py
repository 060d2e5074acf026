"""A DataTable kept in step with live rows: rows added and removed, and only the cells that
changed updated. Columns have fixed widths where they can: a width change makes DataTable
measure every cell again, which costs more than the update itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.text import Text
from textual.widgets import DataTable

Cell = Text | str
Row = tuple[Cell, ...]


def same(a: Cell, b: Cell) -> bool:
    """Equal text and style (Rich's Text equality ignores the base style)."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return a == b


class LiveTable(DataTable[Cell]):
    # (key, label, width); width None: fit the content (for columns that rarely change)
    COLUMNS: ClassVar[Sequence[tuple[str, str, int | None]]] = ()

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id, classes=classes)
        self._rows: dict[str, Row] = {}

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    def sync(self, rows: Mapping[str, Row]) -> None:
        for key in [k for k in self._rows if k not in rows]:
            self.remove_row(key)
            del self._rows[key]
        for key, row in rows.items():
            old = self._rows.get(key)
            if old is None:
                self.add_row(*row, key=key)
            else:
                for i, (col, _label, width) in enumerate(self.COLUMNS):
                    if not old or not same(row[i], old[i]):
                        self.update_cell(key, col, row[i], update_width=width is None)
            self._rows[key] = row

    def forget(self) -> None:
        """Redraw every cell next time (after a theme change)."""
        self._rows = {k: () for k in self._rows}

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None
