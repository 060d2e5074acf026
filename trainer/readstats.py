"""What reading a data source counted (lines, superseded, left out, bad ones with where and
why), and the error for a source that cannot be read at all."""

from __future__ import annotations

from dataclasses import dataclass, field


class SourceError(ValueError):
    """The source as a whole cannot be read (no such folder, no bucket, no batch files, a
    campaign batch that is not the one its commit names)."""


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
    # A campaign's: lines in the batches read that no commit names (a zombie node's, a
    # backup's that lost the commit race), batch objects no commit names (never read), and
    # chunks not committed yet (their indices are missing from the data).
    left_out: int = 0
    unnamed_batches: int = 0
    uncommitted_chunks: int = 0

    def record_bad(self, where: str, reason: str, keep: int = 100) -> None:
        self.bad += 1
        if len(self.bad_examples) < keep:
            self.bad_examples.append(BadLine(where, reason))
