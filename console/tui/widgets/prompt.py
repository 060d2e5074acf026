"""A small modal that asks for one whole number (concurrency, max tokens), with a note beside
the prompt (the current value, the truncation rate) and, where a GPU row is selected, the
choice of applying it to that server only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Checkbox, Input, Label, Static


@dataclass(frozen=True, slots=True)
class ValueAnswer:
    value: int
    server: int | None = None  # None: every server


class ValueModal(ModalScreen[ValueAnswer | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel",
                                                     id="prompt_cancel")]
    DEFAULT_CLASSES = "question"

    def __init__(self, title: str, note: str | None = None, value: int | None = None,
                 minimum: int = 0, server: int | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.note = note
        self.initial = value
        self.minimum = minimum
        self.server = server

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            if self.note:
                yield Static(self.note, classes="dialog-detail", id="note")
            yield Input("" if self.initial is None else str(self.initial), type="integer",
                        id="value", placeholder=f"a whole number >= {self.minimum}")
            if self.server is not None:
                yield Checkbox(f"only server {self.server} (the selected row)", id="one")
            yield Static("", classes="dialog-error", id="error")

    def on_mount(self) -> None:
        field = self.query_one("#value", Input)
        field.focus()
        field.select_all()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < self.minimum:
            self.query_one("#error", Static).update(
                f"{text!r} is not a whole number >= {self.minimum}")
            return
        one = self.server is not None and self.query_one("#one", Checkbox).value
        self.dismiss(ValueAnswer(value, self.server if one else None))

    def action_cancel(self) -> None:
        self.dismiss(None)
