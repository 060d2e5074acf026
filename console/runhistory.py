"""A run's recorded history, read in one place: from a run directory here (a pulled copy) or
through a node's `history` RPC. Both read history.jsonl today (agents/rundir/browse.py);
the node's history store (downsampled steps) replaces the reader behind these two functions,
and nothing else changes. What comes back is the node's, so each item is checked here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.rundir import browse
from console.transport import AgentLink

PAGE = 5000  # the `history` RPC's largest page
# A run of weeks at one sample every 10 s is ~200k samples; a history past this many is cut
# (said in `HistoryRead.cut`) rather than read without end.
MAX_SAMPLES = 1_000_000


class BadHistory(ValueError):
    """A `history` answer that is not one: the node's words, escaped by whoever shows them."""


@dataclass(slots=True)
class HistoryRead:
    """What reading said beyond the samples: lines skipped as unreadable, a refusal (a
    history.jsonl that is a symlink or not a regular file), and whether MAX_SAMPLES cut it."""

    bad_lines: int = 0
    refused: str | None = None
    cut: bool = False


def _page(answer: Any, where: str) -> tuple[list[dict[str, Any]], bool, int, str | None]:
    if not isinstance(answer, dict):
        raise BadHistory(f"{where}: the history answer is not an object")
    items, more = answer.get("items"), answer.get("more", False)
    if not isinstance(items, list) or not isinstance(more, bool):
        raise BadHistory(f"{where}: the history answer has no list of items")
    bad = answer.get("bad_lines", 0)
    refused = answer.get("refused")
    good = [i for i in items if isinstance(i, dict) and isinstance(i.get("updated_at"),
                                                                   (int, float))
            and not isinstance(i.get("updated_at"), bool)]
    bad = (bad if isinstance(bad, int) and not isinstance(bad, bool) and bad >= 0 else 0) \
        + len(items) - len(good)
    return good, more, bad, refused if isinstance(refused, str) else None


def _advance(items: list[dict[str, Any]], since: float, where: str) -> float:
    newest = max(float(i["updated_at"]) for i in items)
    if newest <= since:  # a page that does not move forward would page forever
        raise BadHistory(f"{where}: the history answer went back in time ({newest} <= {since})")
    return newest


def read_dir(run_dir: Path, info: HistoryRead | None = None) -> Iterator[list[dict[str, Any]]]:
    """The samples of a run directory here (a `fleetdeck pull` copy), oldest first, a page at
    a time."""
    info = info if info is not None else HistoryRead()
    since, seen = 0.0, 0
    while True:
        items, more, bad, refused = _page(browse.history(run_dir, since, PAGE), str(run_dir))
        info.bad_lines = max(info.bad_lines, bad)  # each page reads the file from its start
        info.refused = info.refused or refused
        if not items:
            return
        yield items
        seen += len(items)
        if not more:
            return
        if seen >= MAX_SAMPLES:
            info.cut = True
            return
        since = _advance(items, since, str(run_dir))


async def read_link(link: AgentLink, where: str, info: HistoryRead | None = None,
                    timeout: float = 120.0) -> AsyncIterator[list[dict[str, Any]]]:
    """The samples of a node's run through its `history` RPC, oldest first, a page at a time."""
    info = info if info is not None else HistoryRead()
    since, seen = 0.0, 0
    while True:
        answer = await link.call("history", {"since": since, "limit": PAGE}, timeout=timeout)
        items, more, bad, refused = _page(answer, where)
        info.bad_lines = max(info.bad_lines, bad)
        info.refused = info.refused or refused
        if not items:
            return
        yield items
        seen += len(items)
        if not more:
            return
        if seen >= MAX_SAMPLES:
            info.cut = True
            return
        since = _advance(items, since, where)
