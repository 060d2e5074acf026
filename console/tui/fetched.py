"""What the TUI fetched from a node on demand (history for the sparklines, the logs it
follows, recent completions), kept beside FleetState's pushed snapshots. Plain data: widgets
render it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from console.logfollow import FollowedLog, Gained
from console.tui.history import NodeHistory


@dataclass(slots=True)
class LogView:
    """One log as the log pane shows it: its lines, and the pane's place in them (kept while
    another log is shown, so that coming back finds it as it was left)."""

    log: FollowedLog
    follow: bool = True  # polled for new lines, the view kept at the end
    level: int = 0  # the step of logfollow.FILTERS shown
    search: str = ""
    match: int | None = None  # the seq of the line the search is on
    top: int | None = None  # the seq of the first line in view, when not following


@dataclass(slots=True)
class Fetched:
    history: NodeHistory = field(default_factory=NodeHistory)
    logs: dict[str, LogView] = field(default_factory=dict)
    log_name: str | None = None  # the log the pane shows
    samples: list[dict[str, Any]] | None = None
    version: int = 0  # bumped when a log or samples arrive

    @property
    def log(self) -> LogView | None:
        return self.logs.get(self.log_name) if self.log_name is not None else None

    def log_view(self, name: str) -> LogView:
        view = self.logs.get(name)
        if view is None:
            view = self.logs[name] = LogView(FollowedLog(name))
        return view

    def set_log(self, name: str, reply: Any, select: bool = False) -> Gained | None:
        """An answer to `logs` for the log `name` (shown from now on when `select`); raises
        logfollow.BadLogAnswer."""
        log = self.log_view(name).log
        before = (log.end, log.rewrites)
        gained = log.apply(reply)
        if log.old_agent:
            self.log_view(name).follow = False  # a tail only: shown as it was read
        if select or (log.end, log.rewrites) != before:
            self.version += 1  # else nothing to draw: a follow call that found nothing new
        if select:
            self.log_name = name
        return gained

    def select_log(self, name: str) -> None:
        """Show `name` as it was kept (a log not followed is not read again)."""
        self.log_view(name)
        self.log_name = name
        self.version += 1

    def set_samples(self, reply: dict[str, Any]) -> None:
        self.samples = list(reply.get("samples") or [])
        self.version += 1


def log_names(role: str, gpus: list[int]) -> list[str]:
    """The logs of a run, in the order `logs` cycles through them."""
    first = ["train"] if role == "train" else ["generate"]
    return [*first, "supervisor", *(f"sglang_gpu{g}" for g in gpus)]
