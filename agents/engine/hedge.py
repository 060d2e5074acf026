"""Hedging at the tail. A Job is one request (index, attempt) and the copies of it in flight:
the first answer wins and the others are cancelled (and aborted on their servers by whoever
sent them), so the job yields one answer, never two. The Hedger, when the work left is smaller
than the capacity in flight, sends the oldest requests a second copy on an idle server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agents.engine.client import Completion, RequestFailed, rid_for
from agents.engine.deadlines import Pace
from agents.engine.dispatch import Dispatcher, Server

MAX_HEDGES = 2  # extra copies of one request in its whole life (one at a time)


@dataclass(eq=False, slots=True)
class Copy:
    server: Server
    task: asyncio.Task[Completion]
    hedge: bool
    rid: str
    started: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class Outcome:
    """A job's end: the winning answer and where it came from, or the last failure."""

    server: Server
    completion: Completion | None = None
    error: RequestFailed | None = None
    hedge: bool = False


class Job:
    """One request (index, attempt) and its copies in flight."""

    def __init__(self, index: int, attempt: int, engine: str) -> None:
        self.index = index
        self.attempt = attempt
        self.engine = engine
        self.sent = 0  # copies sent, retries and hedges included: each has its own rid
        self.payload: dict[str, Any] | None = None
        self.max_tokens = 0
        self.copies: list[Copy] = []
        self.hedges = 0
        # settle()'s wait: done when a copy ends or one is added (no task of its own).
        self._wake: asyncio.Future[None] | None = None

    def next_rid(self) -> str:
        """The rid of the next copy to send (agents/engine/client.py `rid_for`)."""
        self.sent += 1
        return rid_for(self.index, self.attempt, self.sent, self.engine)

    def add(self, server: Server, task: asyncio.Task[Completion], hedge: bool, rid: str) -> None:
        task.add_done_callback(_retrieve)
        task.add_done_callback(self._poke)
        self.copies.append(Copy(server, task, hedge, rid))
        self._poke()

    def _poke(self, _: Any = None) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    @property
    def servers(self) -> set[int]:
        return {c.server.number for c in self.copies}

    @property
    def started(self) -> float:
        """When its oldest running copy was sent (inf with none running)."""
        return min((c.started for c in self.copies), default=float("inf"))

    async def settle(self) -> Outcome:
        """Wait for the first answer; with every copy failed, the last failure. A copy added
        meanwhile (a hedge) is waited for too."""
        last: Outcome | None = None
        while True:
            if not self.copies:
                assert last is not None, \
                    f"job {self.index}:{self.attempt}: settle() with no copy sent"
                return last
            if not any(c.task.done() for c in self.copies):
                self._wake = asyncio.get_running_loop().create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
            for c in [c for c in self.copies if c.task.done()]:
                self.copies.remove(c)
                if c.task.cancelled():
                    continue
                exc = c.task.exception()
                if exc is None:
                    self.cancel()  # the others lose
                    return Outcome(c.server, completion=c.task.result(), hedge=c.hedge)
                if not isinstance(exc, RequestFailed):
                    self.cancel()
                    raise exc
                last = Outcome(c.server, error=exc, hedge=c.hedge)

    def cancel(self) -> None:
        for c in self.copies:
            c.task.cancel()
        self.copies.clear()


def _retrieve(task: asyncio.Task[Completion]) -> None:
    # A copy cancelled after it failed: read its error, so asyncio does not log it.
    if not task.cancelled():
        task.exception()


class Hedger:
    """Sends the oldest requests a second copy on idle servers, fastest first."""

    def __init__(self, dispatcher: Dispatcher, pace: Pace,
                 send: Callable[[Job, Server, bool], None]) -> None:
        self.dispatcher = dispatcher
        self.pace = pace
        self.send = send
        self.sent = 0

    def min_age(self) -> float | None:
        """A copy younger than the median answer is likely to finish: not hedged yet."""
        return self.pace.median_latency()

    def hedge(self, jobs: Iterable[Job], now: float | None = None) -> int:
        """Hedge what may be hedged now; the number of copies sent."""
        min_age = self.min_age()
        if min_age is None:
            return 0
        now = time.monotonic() if now is None else now
        sent = 0
        # Only jobs with one copy, old enough, are sorted (by that copy's start): at the tail
        # of a run at 10,000 in flight, sorting every job by its oldest copy each round cost
        # ~15 ms of the loop (benchmarks/scale.py --trace-stalls). The same order as before.
        oldest = now - min_age
        ready = [j for j in jobs if len(j.copies) == 1 and j.copies[0].started <= oldest
                 and j.hedges < MAX_HEDGES and j.payload is not None]
        ready.sort(key=lambda j: j.copies[0].started)
        for job in ready:
            server = self.dispatcher.try_acquire(
                job.servers, lambda s: self.pace.tokens_per_s(s.number) or 0.0)
            if server is None:
                break  # no idle server left
            job.hedges += 1
            self.sent += 1
            sent += 1
            self.send(job, server, True)
        return sent
