"""What reading a data source counted (lines, superseded, bad ones with where and why), and
the error for a source that cannot be read at all."""

from __future__ import annotations

from dataclasses import dataclass, field


class SourceError(ValueError):
    """The source as a whole cannot be read (no such folder, no bucket, no batch files)."""


@dataclass
class BadLine:
    where: str
    reason: str


@dataclass
class ReadStats:
    lines: int = 0
    superseded: int = 0
    bad: int = 0
    bad_examples: list[BadLine] = field(default_factory=list)

    def record_bad(self, where: str, reason: str, keep: int = 100) -> None:
        self.bad += 1
        if len(self.bad_examples) < keep:
            self.bad_examples.append(BadLine(where, reason))
