"""Small reusable modals that ask one question: y/n (ConfirmModal) or one of a few choices
(ChoiceModal). Dangerous actions go through ConfirmModal; nothing destructive runs unasked."""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmModal(ModalScreen[bool]):
    """Answer y or n; escape is no."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]
    DEFAULT_CLASSES = "question"

    def __init__(self, question: str, detail: str | None = None, danger: bool = True) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog" + (" danger" if self.danger else "")):
            yield Label(self.question, classes="dialog-title")
            if self.detail:
                yield Static(self.detail, classes="dialog-detail")
            with Horizontal(classes="dialog-buttons"):
                yield Button("[u]Y[/u]es", id="yes", variant="error" if self.danger
                             else "primary")
                yield Button("[u]N[/u]o", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")


class ChoiceModal(ModalScreen[str | None]):
    """One of a few answers, each on its own key; escape cancels (None)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "choose('')", "Cancel",
                                                     id="choice.cancel")]
    DEFAULT_CLASSES = "question"

    def __init__(self, question: str, choices: list[tuple[str, str, str]],
                 detail: str | None = None) -> None:
        """choices: (key, label, value) triples, e.g. ("f", "Failed", "failed")."""
        super().__init__()
        self.question = question
        self.choices = choices
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="dialog-title")
            if self.detail:
                yield Static(self.detail, classes="dialog-detail")
            with Horizontal(classes="dialog-buttons"):
                for key, label, value in self.choices:
                    yield Button(f"[u]{key}[/u] {label}", id=f"choice-{value}", name=value)
                yield Button("Cancel", id="cancel")

    def on_key(self, event: events.Key) -> None:
        for key, _label, value in self.choices:
            if event.key == key:
                event.stop()
                self.dismiss(value)
                return

    def action_choose(self, value: str) -> None:
        self.dismiss(value or None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.name or None)
