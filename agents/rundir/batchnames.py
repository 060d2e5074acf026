"""Batch file names, defined once: `completions/completions_NNNNNN.jsonl` for a closed batch,
with `.partial` while it is open; a shard of a campaign puts its tag before the number
(`completions_s03of08_000123.jsonl`), so every node can write to one S3 prefix. Everything
that lists, counts or names batches (the store, verify, the manifest, samples, retries, the
trainer's source, pull) goes through here, and filters by the shard with `in_shard`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from agents.rundir.shard import Shard, parse_tag

FOLDER = "completions"
PARTIAL = ".partial"
_RE = re.compile(r"^completions_(?:(s\d{2,6}of\d{2,6})_)?(\d{6,})\.jsonl(\.partial)?$")

# `in_shard(name, ANY)`: every batch of every shard (the trainer, the campaign's union).
ANY: Final = "any"
Which = Shard | None | Literal["any"]


@dataclass(frozen=True, slots=True)
class BatchName:
    number: int
    open: bool  # `.partial`: the batch the engine is still writing
    shard: Shard | None = None


def batch_name(number: int, open: bool = False, shard: Shard | None = None) -> str:
    tag = f"{shard.tag}_" if shard is not None else ""
    return f"completions_{tag}{number:06d}.jsonl" + (PARTIAL if open else "")


def parse_batch_name(name: str) -> BatchName | None:
    """The batch a file name denotes, or None when it is not a batch file."""
    m = _RE.match(name)
    if m is None:
        return None
    shard = None
    if m.group(1) is not None:
        shard = parse_tag(m.group(1))
        if shard is None:
            return None
    return BatchName(int(m.group(2)), bool(m.group(3)), shard)


def in_shard(name: str, which: Which, closed_only: bool = False) -> bool:
    """Whether `name` is a batch of `which`: a Shard's own batches, None for an unsharded
    run's, ANY for every batch."""
    b = parse_batch_name(name)
    if b is None or (closed_only and b.open):
        return False
    return which == ANY or b.shard == which


def is_closed_batch(name: str, which: Which = ANY) -> bool:
    return in_shard(name, which, closed_only=True)


def batch_files(folder: Path, closed_only: bool = False, which: Which = ANY) -> list[Path]:
    """Batch files directly in `folder` of `which` (every shard unless told), in batch order
    (a name sorts as its shard, then its number); the open batch included unless
    `closed_only`."""
    found = [path for path in folder.glob("completions_*")
             if in_shard(path.name, which, closed_only)]
    return sorted(found, key=lambda p: p.name)


__all__ = ["ANY", "FOLDER", "PARTIAL", "BatchName", "Which", "batch_files", "batch_name",
           "in_shard", "is_closed_batch", "parse_batch_name"]
