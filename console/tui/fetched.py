"""What the TUI fetched from a node on demand (history for the sparklines, a log tail, recent
completions), kept beside FleetState's pushed snapshots. Plain data: widgets render it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from console.tui.history import NodeHistory


@dataclass(slots=True)
class LogTail:
    name: str
    path: str
    lines: list[str]


@dataclass(slots=True)
class Fetched:
    history: NodeHistory = field(default_factory=NodeHistory)
    log: LogTail | None = None
    samples: list[dict[str, Any]] | None = None
    version: int = 0  # bumped when a log or samples arrive

    def set_log(self, name: str, reply: dict[str, Any]) -> None:
        self.log = LogTail(name, str(reply.get("path", name)), list(reply.get("lines") or []))
        self.version += 1

    def set_samples(self, reply: dict[str, Any]) -> None:
        self.samples = list(reply.get("samples") or [])
        self.version += 1


def log_names(role: str, gpus: list[int]) -> list[str]:
    """The logs of a run, in the order `logs` cycles through them."""
    first = ["train"] if role == "train" else ["generate"]
    return [*first, "supervisor", *(f"sglang_gpu{g}" for g in gpus)]
