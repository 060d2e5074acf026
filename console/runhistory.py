"""A run's recorded history, read in one place: from a run directory here (a pulled copy) or
through a node's `history` RPC. Both read history.jsonl's samples as written
(agents/rundir/browse.py), a page at a time by byte offset. What comes back is the node's,
so each item is checked here."""

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


class _Pager:
    """Where the next page starts: the byte offset the last answer gave (`next_offset`), or,
    from an agent before it, the newest time seen (`since`, which loses samples that share
    that time: all such an agent offers)."""

    def __init__(self, where: str, info: HistoryRead) -> None:
        self.where, self.info = where, info
        self.since, self.offset, self.seen = 0.0, None, 0
        self._bad_before = 0

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"since": self.since, "limit": PAGE}
        if self.offset is not None:
            out["offset"] = self.offset
        return out

    def take(self, answer: Any) -> tuple[list[dict[str, Any]], bool]:
        """The page's samples, and whether to ask for the next."""
        items, more, bad, refused = _page(answer, self.where)
        offset = answer.get("next_offset")
        by_offset = isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0
        # By offset each page counts its own lines; by `since` each reads from the start.
        self._bad_before = self._bad_before + bad if by_offset else max(self._bad_before, bad)
        self.info.bad_lines = self._bad_before
        self.info.refused = self.info.refused or refused
        if not items:
            return items, False
        self.seen += len(items)
        if not more:
            return items, False
        if self.seen >= MAX_SAMPLES:
            self.info.cut = True
            return items, False
        if by_offset:
            if self.offset is not None and offset <= self.offset:
                raise BadHistory(f"{self.where}: the history answer did not move on (offset "
                                 f"{offset} after {self.offset})")
            self.offset = offset
        else:
            self.since = _advance(items, self.since, self.where)
        return items, True


def _advance(items: list[dict[str, Any]], since: float, where: str) -> float:
    newest = max(float(i["updated_at"]) for i in items)
    if newest <= since:  # a page that does not move forward would page forever
        raise BadHistory(f"{where}: the history answer went back in time ({newest} <= {since})")
    return newest


def read_dir(run_dir: Path, info: HistoryRead | None = None) -> Iterator[list[dict[str, Any]]]:
    """The samples of a run directory here (a `fleetdeck pull` copy), oldest first, a page at
    a time."""
    pager = _Pager(str(run_dir), info if info is not None else HistoryRead())
    while True:
        p = pager.params()
        try:
            answer = browse.history(run_dir, p["since"], PAGE, p.get("offset"))
        except ValueError as exc:  # the file was cut or rewritten under the read
            raise BadHistory(str(exc)) from None
        items, going_on = pager.take(answer)
        if items:
            yield items
        if not going_on:
            return


async def read_link(link: AgentLink, where: str, info: HistoryRead | None = None,
                    timeout: float = 120.0) -> AsyncIterator[list[dict[str, Any]]]:
    """The samples of a node's run through its `history` RPC, oldest first, a page at a time."""
    pager = _Pager(where, info if info is not None else HistoryRead())
    while True:
        answer = await link.call("history", pager.params(), timeout=timeout)
        items, going_on = pager.take(answer)
        if items:
            yield items
        if not going_on:
            return
