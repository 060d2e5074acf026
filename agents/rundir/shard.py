"""Shards of a campaign: `[generate] shard = "K/N"` makes a run own the indices `i % N == K` of
the full prompts file. The index stays the line number in the full file, so every shard's
lines merge without a collision; batch names and S3 keys carry the shard's tag
(`completions_s03of08_000123.jsonl`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TEXT = re.compile(r"^\s*(\d{1,6})\s*/\s*(\d{1,6})\s*$")
_TAG = re.compile(r"^s(\d{2,6})of(\d{2,6})$")


@dataclass(frozen=True, slots=True)
class Shard:
    k: int
    n: int

    def __post_init__(self) -> None:
        if not (self.n >= 1 and 0 <= self.k < self.n):
            raise ValueError(f"shard {self.k}/{self.n}: K must be 0..N-1 and N at least 1 "
                             "(K is 0-based: the shards of 8 are 0/8 .. 7/8)")

    def owns(self, index: int) -> bool:
        return index % self.n == self.k

    @property
    def text(self) -> str:
        return f"{self.k}/{self.n}"

    @property
    def tag(self) -> str:
        width = max(2, len(str(self.n)))
        return f"s{self.k:0{width}d}of{self.n:0{width}d}"

    def count(self, total: int) -> int:
        """How many of the indices 0..total-1 the shard owns."""
        if total <= self.k:
            return 0
        return (total - 1 - self.k) // self.n + 1

    def __str__(self) -> str:
        return self.text


def parse_shard(text: object, where: str) -> Shard:
    """`"K/N"` as a Shard; ValueError naming `where` for anything else."""
    m = _TEXT.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{where}: shard must be \"K/N\" (K-th of N, 0-based, e.g. \"3/8\"), "
                         f"got {text!r}")
    try:
        return Shard(int(m.group(1)), int(m.group(2)))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def parse_tag(tag: str) -> Shard | None:
    """A batch name's shard tag (`s03of08`) as a Shard; None when it is not one."""
    m = _TAG.match(tag)
    if m is None or len(m.group(1)) != len(m.group(2)):
        return None
    try:
        shard = Shard(int(m.group(1)), int(m.group(2)))
    except ValueError:
        return None
    return shard if shard.tag == tag else None


def partition_problem(shards: list[tuple[str, Shard]]) -> str | None:
    """Why these (node, shard) pairs do not split a prompt set exactly once, or None: every
    N the same, no K twice, no K missing."""
    if not shards:
        return "no shards"
    ns = {s.n for _, s in shards}
    if len(ns) > 1:
        listed = ", ".join(f"{node} {s.text}" for node, s in shards)
        return f"the shards do not agree on N ({listed}): every node of a campaign splits by " \
               "the same N"
    n = ns.pop()
    by_k: dict[int, list[str]] = {}
    for node, s in shards:
        by_k.setdefault(s.k, []).append(node)
    twice = [f"{' and '.join(nodes)} are both {k}/{n}" for k, nodes in sorted(by_k.items())
             if len(nodes) > 1]
    if twice:
        return "shards overlap: " + "; ".join(twice) + " (their indices would be sent twice)"
    missing = [f"{k}/{n}" for k in range(n) if k not in by_k]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8
                                           else "")
        return f"shards leave a gap: no node has {shown} (those indices would never be sent)"
    return None


__all__ = ["Shard", "parse_shard", "parse_tag", "partition_problem"]
