"""Reading what the TUI shows: the screen as plain text, the latest snapshot, notifications
(kept up for snapshot images)."""

from __future__ import annotations

from typing import Any

from textual.message import Message
from textual.notifications import Notify

from agents.rundir.schema import Progress, Snapshot
from console.tui.app import FleetdeckApp


def screen_text(app: FleetdeckApp) -> str:
    """Every character on screen now, one line per row (what a person would read)."""
    update = app.screen._compositor.render_full_update()
    return "\n".join("".join(seg.text for seg in strip) for strip in update.strips)


def snapshot(app: FleetdeckApp, node: str = "sim-1") -> Snapshot | None:
    return app.state.nodes[node].snapshot


def progress(app: FleetdeckApp, node: str = "sim-1") -> Progress | None:
    snap = snapshot(app, node)
    return snap.progress if snap is not None else None


def lasting(app: FleetdeckApp) -> None:
    """Toasts stay up until a snapshot image is taken. They expire by the wall clock (an
    alert's after 15 s), which a loaded machine can spend before the image: the frozen clock
    keeps every age on screen, and this keeps every toast."""
    notify = app.notify

    def notify_lasting(message: str, **kwargs: Any) -> None:
        notify(message, **{**kwargs, "timeout": 3600})

    app.notify = notify_lasting  # type: ignore[method-assign]


class Recorder:
    """A run_test(message_hook=...) that keeps every notification's text (toasts expire)."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def __call__(self, message: Message) -> None:
        if isinstance(message, Notify):
            self.notes.append(message.notification.message)

    def has(self, text: str) -> bool:
        return any(text in n for n in self.notes)


def server(app: FleetdeckApp, number: int, node: str = "sim-1") -> Any:
    snap = snapshot(app, node)
    if snap is None:
        return None
    return next((s for s in snap.servers if s.number == number), None)
