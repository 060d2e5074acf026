"""The retry question: re-queue the failed indices, the truncated ones, or only the long
truncated ones (not those cut in a repetition loop, which more tokens do not help)."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import BindingType

from console.tui.widgets.confirm import ChoiceModal, choice


class RetryModal(ChoiceModal):
    BINDINGS: ClassVar[list[BindingType]] = [
        choice("f", "failed", "failed", "retry_failed"),
        choice("t", "truncated", "truncated", "retry_truncated"),
        choice("l", "long", "long only (not loops)", "retry_long"),
    ]

    def __init__(self, node: str, detail: str | None = None) -> None:
        super().__init__(f"Retry which indices on {node}?", detail)
