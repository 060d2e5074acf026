"""Batch file names, defined once: `completions/completions_NNNNNN.jsonl` for a closed batch,
with `.partial` while it is open. Everything that lists, counts or names batches (the store,
verify, the manifest, samples, retries, the trainer's source, pull) goes through here. A
campaign node's batches keep these names; their S3 keys carry the node and its run id
(`batches/NODE/RUN_ID/`, agents/queue/layout.py), so every node writes to one prefix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FOLDER = "completions"
PARTIAL = ".partial"
_RE = re.compile(r"^completions_(\d{6,})\.jsonl(\.partial)?$")


@dataclass(frozen=True, slots=True)
class BatchName:
    number: int
    open: bool  # `.partial`: the batch the engine is still writing


def batch_name(number: int, open: bool = False) -> str:
    return f"completions_{number:06d}.jsonl" + (PARTIAL if open else "")


def parse_batch_name(name: str) -> BatchName | None:
    """The batch a file name denotes, or None when it is not a batch file."""
    m = _RE.match(name)
    if m is None:
        return None
    return BatchName(int(m.group(1)), bool(m.group(2)))


def is_batch(name: str, closed_only: bool = False) -> bool:
    b = parse_batch_name(name)
    return b is not None and not (closed_only and b.open)


def is_closed_batch(name: str) -> bool:
    return is_batch(name, closed_only=True)


def batch_files(folder: Path, closed_only: bool = False) -> list[Path]:
    """Batch files directly in `folder`, in batch order; the open batch included unless
    `closed_only`."""
    found = [path for path in folder.glob("completions_*") if is_batch(path.name, closed_only)]
    return sorted(found, key=lambda p: p.name)


__all__ = ["FOLDER", "PARTIAL", "BatchName", "batch_files", "batch_name", "is_batch",
           "is_closed_batch", "parse_batch_name"]
