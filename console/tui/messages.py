"""Messages the console's workers post to the app: link changes, fetched data, action
results. Workers never touch widgets; the app turns these into state and notifications."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from console.linkstate import LinkState


class LinkChanged(Message):
    def __init__(self, node: str, state: LinkState, error: str | None) -> None:
        super().__init__()
        self.node, self.state, self.error = node, state, error


class HistoryFetched(Message):
    def __init__(self, node: str, items: list[dict[str, Any]], span: str = "1h",
                 step_s: float | None = None) -> None:
        super().__init__()
        self.node, self.items, self.span, self.step_s = node, items, span, step_s


class LogFetched(Message):
    """An answer to `logs` (None: the log shown as kept, not read again); `select`: the log
    pane shows this log from now on; `error`: following it failed (it stops following)."""

    def __init__(self, node: str, name: str, reply: Any, select: bool = False,
                 error: str | None = None) -> None:
        super().__init__()
        self.node, self.name, self.reply, self.select = node, name, reply, select
        self.error = error


class SamplesFetched(Message):
    def __init__(self, node: str, reply: dict[str, Any]) -> None:
        super().__init__()
        self.node, self.reply = node, reply


class ActionReport(Message):
    """An action's outcome, for a notification: the agent's answer or its error."""

    def __init__(self, node: str, text: str, ok: bool = True) -> None:
        super().__init__()
        self.node, self.text, self.ok = node, text, ok
