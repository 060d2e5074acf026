"""failures.jsonl: the engine's append-only journal of what is not a completion.

An index's state here is its last event: `failed` (gave up), `requeued` (to be generated again
at a generation attempt). `retry` events record which retry requests were applied.
"""

from __future__ import annotations

import time
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from agents.engine.doneset import DoneSet
from agents.engine.durable import DurableAppend
from agents.rundir.atomic import cut_torn_tail
from agents.rundir.schema import FailureEvent, encoder, failure_decoder


@dataclass(slots=True)
class JournalState:
    # index -> (last event, generation attempt it concerns, error class or retry reason)
    last: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    retry_applied: dict[str, int] = field(default_factory=dict)
    bad_input: int = 0
    # Indices whose last event is `failed` and that are not done (kept as events and the
    # done-set change, so the engine's snapshot counts failures in O(1), not O(journal)).
    failed_open: set[int] = field(default_factory=set)
    done: Container[int] | None = None


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = JournalState()
        self._file: DurableAppend | None = None

    def recover(self) -> JournalState:
        cut_torn_tail(self.path)
        if self.path.exists():
            with open(self.path, "rb") as f:
                for lineno, raw in enumerate(f, 1):
                    if not raw.strip():
                        continue
                    try:
                        ev = failure_decoder.decode(raw)
                    except msgspec.DecodeError as exc:
                        raise ValueError(
                            f"{self.path}:{lineno}: unreadable record: {exc}"
                        ) from None
                    self._apply(ev)
        self._file = DurableAppend(self.path, "journal")
        return self.state

    def _apply(self, ev: FailureEvent) -> None:
        if ev.event == "retry":
            if ev.what is not None and ev.rev is not None:
                self.state.retry_applied[ev.what] = max(
                    ev.rev, self.state.retry_applied.get(ev.what, 0)
                )
            return
        if ev.index is None:
            return
        if ev.event == "failed" and ev.error == "bad_input":
            self.state.bad_input += 1
        detail = (ev.error if ev.event == "failed" else ev.what) or ""
        self.state.last[ev.index] = (ev.event, ev.attempt or 1, detail)
        done = self.state.done
        if ev.event == "failed" and (done is None or ev.index not in done):
            self.state.failed_open.add(ev.index)
        else:
            self.state.failed_open.discard(ev.index)

    def watch_done(self, done: DoneSet) -> None:
        """Keep `failed_open` true to `done` from now on: an index done leaves it."""
        self.state.done = done
        self.state.failed_open = {i for i in self.state.failed_open if i not in done}
        done.on_new = self.state.failed_open.discard

    def append(self, events: list[FailureEvent]) -> None:
        """Write events with one fsync, or none of them (a failed write is cut back);
        blocking: call from a worker thread."""
        if not events:
            return
        assert self._file is not None, "recover() first"
        buf = b"".join(encoder.encode(ev) + b"\n" for ev in events)
        self._file.append(buf)
        for ev in events:
            self._apply(ev)

    def failed_indices(self, include_bad_input: bool = False) -> list[int]:
        return [i for i, (ev, _, err) in self.state.last.items()
                if ev == "failed" and (include_bad_input or err != "bad_input")]

    def failed_count(self) -> int:
        """Indices whose last event is `failed`, done ones left out once watch_done is on."""
        return len(self.state.failed_open)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def failed(index: int, error: str, message: str, attempts: int, server: int | None,
           attempt: int = 1, line: int | None = None) -> FailureEvent:
    return FailureEvent(event="failed", time=time.time(), index=index, error=error,
                        message=message[:2000], attempts=attempts, server=server,
                        attempt=attempt, line=line)


def requeued(index: int, attempt: int, what: str, server: int | None = None,
             message: str | None = None) -> FailureEvent:
    """`server` and `message`: the copy's, for a requeue the engine made itself (a deadline
    missed there), so the failures view can name where and why."""
    return FailureEvent(event="requeued", time=time.time(), index=index, attempt=attempt,
                        what=what, server=server,
                        message=None if message is None else message[:2000])


def retry_applied(what: str, rev: int) -> FailureEvent:
    return FailureEvent(event="retry", time=time.time(), what=what, rev=rev)
