"""Small reusable modals that ask one question: y/n (ConfirmModal) or one of a few choices
(ChoiceModal). Dangerous actions go through ConfirmModal; nothing destructive runs unasked.
Every answer is a Binding with an id, so [console.keymap] can move it, and the buttons name
the keys actually bound."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from console.tui.widgets.keys import key_for, mnemonic


class ConfirmModal(ModalScreen[bool]):
    """Answer yes (confirm_yes, y) or no (confirm_no, n or escape)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm_yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm_no"),
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
                yield Button(mnemonic("Yes", key_for(self, "confirm_yes")), id="yes",
                             variant="error" if self.danger else "primary")
                yield Button(mnemonic("No", key_for(self, "confirm_no")), id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")


def choice(key: str, value: str, label: str, binding_id: str) -> Binding:
    """One answer of a ChoiceModal: `key` (remappable as `binding_id`) answers `value`."""
    return Binding(key, f"choose('{value}')", label, id=binding_id)


class ChoiceModal(ModalScreen[str | None]):
    """One of a few answers, each a binding made by choice() in a subclass's BINDINGS (one
    button per answer, in that order); escape cancels (None)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "choose('')", "Cancel",
                                                     id="choice_cancel")]
    DEFAULT_CLASSES = "question"

    def __init__(self, question: str, detail: str | None = None) -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    @classmethod
    def choices(cls) -> list[tuple[str, str, str]]:
        """(binding id, label, value) of each answer the class declares."""
        out = []
        for b in Binding.make_bindings(cls.BINDINGS):
            value = b.action.removeprefix("choose('").removesuffix("')")
            if b.id is not None and b.action.startswith("choose('") and value:
                out.append((b.id, b.description, value))
        return out

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="dialog-title")
            if self.detail:
                yield Static(self.detail, classes="dialog-detail")
            with Horizontal(classes="dialog-buttons"):
                for binding_id, label, value in self.choices():
                    yield Button(f"[u]{key_for(self, binding_id)}[/u] {label}",
                                 id=f"choice-{value}", name=value)
                yield Button("Cancel", id="cancel")

    def action_choose(self, value: str) -> None:
        self.dismiss(value or None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.name or None)
