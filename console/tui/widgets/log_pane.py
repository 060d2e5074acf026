"""A log tail of the run (the `logs` RPC): the engine's log or one server's."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Log

from console.sanitize import shown, shown_markup


class LogPane(Vertical):
    def __init__(self, key: str, **kwargs: Any) -> None:
        """`key`: the key of the `logs` action, for the hint."""
        super().__init__(**kwargs)
        self.key = key

    def compose(self) -> ComposeResult:
        yield Label(f"press {self.key} for the log tail (the selected GPU's server log when the "
                    "GPU table has focus)", id="log-title", classes="pane-title")
        yield Log(id="log", max_lines=5000, auto_scroll=True)

    def show(self, name: str, path: str, lines: list[str]) -> None:
        self.query_one("#log-title", Label).update(
            shown_markup(f"{name}  ({path}, last {len(lines)} lines)"))
        log = self.query_one("#log", Log)
        log.clear()
        log.write_lines([shown(line, keep_tabs=True) for line in lines])  # escapes shown

    @property
    def lines(self) -> list[str]:
        return list(self.query_one("#log", Log).lines)
