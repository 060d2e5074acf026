"""Request deadlines from what the servers actually do: each server's recent decode pace
(output tokens per second per request, from its answers, or from SGLang's metrics until it has
answered), the time that pace gives a request's max_tokens, lengthened by the turns it may
wait on the server (its queue, a retraction: agents/engine/serverload.py), and a send that
gives up at `deadline_factor` x that time (clamped to [min_deadline_s, request_timeout_s])."""

from __future__ import annotations

import asyncio
import bisect
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agents.engine.client import Aborted, Completion, RequestFailed, ServerClient, chat
from agents.engine.serverload import ServerLoad

WINDOW = 32  # answers per server that make its pace
MIN_ANSWERS = 4  # fewer than this: the pace of the whole fleet, or SGLang's own figures
LATENCIES_KEPT = 256
# A copy whose deadline is not known yet and that has no `changed` to wait on asks again this
# often. A copy with a deadline asks again only when it comes (Pace keeps, per server, the
# highest deadline multiplier seen since any moment: `Peak`).
RECHECK_S = 0.5
# Copies woken at once when a pace becomes known, each loop turn: at 10,000 in flight all of
# them wait for the first answers, and arming them all in one turn held the loop ~100 ms.
WAKE_SLICE = 256
# Waiting copies kept before those that ended are dropped (while no pace is known, as when
# every answer so far has no tokens, nothing wakes them): then at twice the live ones.
PRUNE_MIN = 1024
# Values a Peak keeps closer together than this are one (the higher, at the later time).
PEAK_RESOLUTION_S = 0.01
# After /abort_request, how long the server's answer to the aborted request (finish_reason
# abort) is waited for. A loaded real server took 2-4 s: it ends the request at its next step.
ABORT_CONFIRM_S = 10.0


@dataclass(frozen=True, slots=True)
class Deadline:
    seconds: float
    tokens_per_s: float  # the per-request pace it was computed from
    max_tokens: int
    # Answers' times allowed for beyond the request's own: its turn in the server's queue
    # (queued / running, as the server reported it) and one more when the server retracted
    # requests while this one was out (a retracted request waits its turn again).
    waits: float = 0.0
    why_waits: str = ""

    def why(self, factor: float) -> str:
        turns = f" x (1 + {self.waits:.2g}: {self.why_waits})" if self.waits else ""
        return (f"{factor:g} x {self.max_tokens} tokens at {self.tokens_per_s:.1f} tokens/s "
                f"per request{turns} = {self.seconds:.1f} s")


class Pace:
    """Per-server decode pace and the fleet's recent request latencies."""

    def __init__(self, factor: float, min_s: float, max_s: float) -> None:
        self.factor = factor
        self.min_s = min_s
        self.max_s = max_s
        self._answers: dict[int, Window] = {}
        self._hints: dict[int, float] = {}
        self._latencies: deque[float] = deque(maxlen=LATENCIES_KEPT)
        self._load: dict[int, ServerLoad] = {}
        self._retracted_at: dict[int, float] = {}  # the last reading that saw a retraction
        # Copies whose deadline is not known yet, woken when a pace may be (changed()), and
        # those being woken, WAKE_SLICE a loop turn.
        self._waiters: list[asyncio.Future[None]] = []
        self._waking: deque[asyncio.Future[None]] = deque()
        self._prune_at = PRUNE_MIN
        # What was known at the last wake: the servers with a pace of their own or SGLang's
        # (those in _peaks) and whether the fleet's is known. A copy waits only while its
        # server has none, so nothing else can be news to it.
        self._known: tuple[int, bool] = (0, False)
        # Per server, the deadline's multipliers as they changed: (1 + queue waits) / pace
        # and 1 / pace, each kept as the highest since any moment (Peak), so a copy asks for
        # its deadline only when it comes and gets the longest it had in the meantime.
        self._peaks: dict[int, tuple[Peak, Peak]] = {}

    def changed(self) -> asyncio.Future[None]:
        """Done at the next figure that may make a pace known: a copy with no deadline yet
        waits on it and on its answer, instead of looking again every so often."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if len(self._waiters) >= self._prune_at:  # those whose copies ended (cancelled)
            self._waiters = [w for w in self._waiters if not w.done()]
            self._prune_at = max(PRUNE_MIN, 2 * len(self._waiters))
        self._waiters.append(fut)
        return fut

    def _wake(self) -> None:
        """Wake the waiting copies when a pace became known for a server that had none (each
        answer until then woke them all, and each went back to waiting), WAKE_SLICE a loop
        turn, so that the loop's other work runs between slices."""
        # Once known the fleet's pace stays known (windows only fill): no sum at each answer.
        known = (len(self._peaks), self._known[1] or self._fleet()[0] >= MIN_ANSWERS)
        if known == self._known:
            return
        self._known = known
        if not self._waiters:
            return
        started = bool(self._waking)
        self._waking.extend(self._waiters)
        self._waiters = []
        if not started:
            self._wake_slice()

    def _wake_slice(self) -> None:
        waking = self._waking
        for _ in range(min(WAKE_SLICE, len(waking))):
            w = waking.popleft()
            if not w.done():
                w.set_result(None)
        if waking:  # after the callbacks just scheduled: the next slice is a turn later
            asyncio.get_running_loop().call_soon(self._wake_slice)

    def _fleet(self) -> tuple[int, float | None]:
        """The answers every server's window holds, and their pace: O(servers)."""
        count, tokens, seconds = 0, 0, 0.0
        for w in self._answers.values():
            count += len(w.kept)
            tokens += w.tokens
            seconds += w.seconds
        return count, (tokens / seconds if seconds > 0 else None)

    def observe(self, server: int, tokens: int, latency_s: float) -> None:
        """One answer (any copy's, a hedge that lost included)."""
        if latency_s <= 0:
            return
        self._latencies.append(latency_s)
        if tokens > 0:
            self._window(server).add(tokens, latency_s)
            self._paces_changed(server)
            self._wake()

    def observe_aborted(self, server: int, tokens: int, elapsed_s: float) -> None:
        """A copy given up at its deadline that the server confirmed, with the tokens it had
        made: its pace joins the server's. When the server slowed for every request (a load
        elsewhere on the machine, a burst of other clients), the copies in flight all miss
        together and none answers; without this their retries would meet the same stale
        pace, miss in turn and end as failed. Not an answer: the median latency stays as it
        was."""
        if tokens > 0 and elapsed_s > 0:
            self._window(server).add(tokens, elapsed_s)
            self._paces_changed(server)
            self._wake()

    def _window(self, server: int) -> Window:
        w = self._answers.get(server)
        if w is None:
            w = self._answers[server] = Window()
        return w

    def observe_figures(self, server: int, gen_throughput: float | None,
                        running: int | None) -> None:
        """SGLang's own view (/metrics or the decode log): output tokens/s over the running
        batch. Used only until the server has answered MIN_ANSWERS times."""
        if gen_throughput and running and gen_throughput > 0 and running > 0:
            self._hints[server] = gen_throughput / running
            self._note(server)
            self._wake()

    def observe_load(self, server: int, load: ServerLoad, now: float | None = None) -> None:
        """SGLang's own figures of a server, each refresh (the supervisor's): its pace, as
        observe_figures, and its queue and retractions, which deadlines allow for."""
        now = time.monotonic() if now is None else now
        self.observe_figures(server, load.gen_throughput, load.running)
        before = self._load.get(server)
        if before is not None and load.retracted > before.retracted:
            self._retracted_at[server] = now
        self._load[server] = load
        self._note(server, now)

    def _paces_changed(self, server: int) -> None:
        """An answer changed this server's pace, and the fleet's, which servers with few
        answers of their own go by."""
        now = time.monotonic()
        for number in self._peaks:
            if number == server or self._few_answers(number):
                self._note(number, now)
        if server not in self._peaks:
            self._note(server, now)

    def _few_answers(self, server: int) -> bool:
        own = self._answers.get(server)
        return own is None or len(own.kept) < MIN_ANSWERS

    def _note(self, server: int, now: float | None = None) -> None:
        """The server's deadline multipliers as they are now, into its peaks."""
        pace = self.tokens_per_s(server)
        if not pace:
            return
        now = time.monotonic() if now is None else now
        peaks = self._peaks.get(server)
        if peaks is None:
            peaks = self._peaks[server] = (Peak(), Peak())
        queued, _ = self._queue_waits(server)
        for peak, value in zip(peaks, ((1 + queued) / pace, 1 / pace), strict=True):
            peak.add(now, value)
            peak.forget(now - self.max_s)  # a copy that old is past any deadline

    def waits(self, server: int, sent_at: float | None) -> tuple[float, str]:
        """Answers' times a request sent at `sent_at` may spend waiting on this server,
        beyond its own: a queued request has not started, and a retracted one starts again
        behind the queue. Without this a server short of KV room, whose queue is long and
        which retracts, would see its waiting requests aborted and sent again, each time to
        the back of the same queue: a storm of aborts and resends that adds only work."""
        waits, why = self._queue_waits(server)
        if self._retracted_since(server, sent_at):
            waits += 1.0
            why = ", ".join(w for w in (why, "it retracted requests") if w)
        return waits, why

    def _queue_waits(self, server: int) -> tuple[float, str]:
        load = self._load.get(server)
        if load is None or not load.queued:
            return 0.0, ""
        running = max(load.running or 0, 1)
        return load.queued / running, f"{load.queued} queued behind {load.running or 0} running"

    def _retracted_since(self, server: int, sent_at: float | None) -> bool:
        at = self._retracted_at.get(server)
        return at is not None and (sent_at is None or at >= sent_at)

    def tokens_per_s(self, server: int) -> float | None:
        """Tokens per second per request: output tokens over the time they took (queue and
        prefill included, so the pace errs slow), this server's, else SGLang's, else the
        fleet's."""
        own = self._answers.get(server)
        if own is not None and len(own.kept) >= MIN_ANSWERS:
            return own.ratio()
        hint = self._hints.get(server)
        if hint is not None:
            return hint
        count, pace = self._fleet()
        return pace if count >= MIN_ANSWERS else None

    def deadline(self, server: int, max_tokens: int,
                 sent_at: float | None = None) -> Deadline | None:
        """The deadline by the server's pace and queue now. None when deadlines are off or
        nothing is known yet (request_timeout_s holds). `sent_at` (monotonic): when the copy
        went out, for the retractions since."""
        return self._deadline(server, max_tokens, sent_at, False)

    def longest(self, server: int, max_tokens: int, sent_at: float) -> Deadline | None:
        """The longest deadline a copy sent at `sent_at` had since: what a copy asks for
        when its deadline comes (send_within), so that it need not ask in between."""
        return self._deadline(server, max_tokens, sent_at, True)

    def _deadline(self, server: int, max_tokens: int, sent_at: float | None,
                  since: bool) -> Deadline | None:
        if self.factor <= 0:
            return None
        pace = self.tokens_per_s(server)
        if not pace:
            return None
        queued, why = self._queue_waits(server)
        turns, per_token = (1 + queued) / pace, 1 / pace
        peaks = self._peaks.get(server)
        if since and sent_at is not None and peaks is not None:
            # The longest it had since it was sent: a queue that has gone, a pace that was
            # slower (the first part of a request ran in a fuller batch).
            before = (peaks[0].since(sent_at), peaks[1].since(sent_at))
            if before[0] is not None and before[0] > turns:
                turns = before[0]
                why = ", ".join(w for w in (why, "a longer queue or a slower pace since it "
                                            "was sent") if w)
            if before[1] is not None:
                per_token = max(per_token, before[1])
        if self._retracted_since(server, sent_at):
            turns += per_token  # it waits its turn again
            why = ", ".join(w for w in (why, "it retracted requests") if w)
        seconds = min(max(self.factor * max_tokens * turns, self.min_s), self.max_s)
        return Deadline(seconds, pace, max_tokens, turns * pace - 1, why)

    def median_latency(self) -> float | None:
        """The median latency of recent answers, fleet-wide (None before any)."""
        return statistics.median(self._latencies) if self._latencies else None


class Window:
    """A server's last WINDOW answers (tokens, seconds) with their sums kept as they come and
    go: its pace is asked at every send, and summing the window each time cost O(WINDOW)."""

    __slots__ = ("_adds", "kept", "seconds", "tokens")

    def __init__(self) -> None:
        self.kept: deque[tuple[int, float]] = deque()
        self.tokens = 0
        self.seconds = 0.0
        self._adds = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.kept.append((tokens, seconds))
        self.tokens += tokens
        self.seconds += seconds
        if len(self.kept) > WINDOW:
            t, s = self.kept.popleft()
            self.tokens -= t
            self.seconds -= s
        self._adds += 1
        if self._adds % 1024 == 0:  # no float drift from the running sums over a long run
            self.seconds = sum(s for _, s in self.kept)

    def ratio(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


class Peak:
    """Values as they came, each with its time, asked for the highest that came after a
    moment: a list decreasing from old to new (a new value drops the ones it is not lower
    than, which no later question can need), so adding is O(1) amortized and asking is a
    bisection. Values older than `forget`'s moment go."""

    __slots__ = ("_head", "_start", "_times", "_values")

    def __init__(self) -> None:
        self._times: list[float] = []
        self._values: list[float] = []
        self._head = 0
        self._start = 0.0  # when the last entry's first value came

    def add(self, at: float, value: float) -> None:
        times, values = self._times, self._values
        dropped = False
        while len(values) > self._head and values[-1] <= value:
            times.pop()
            values.pop()
            dropped = True
        if not dropped and len(values) > self._head and at - self._start < PEAK_RESOLUTION_S:
            # A lower value within PEAK_RESOLUTION_S of the last one's first: the last one
            # stands until now. At most one new entry every PEAK_RESOLUTION_S that does not
            # drop one, whatever the answers' rate; never a shorter deadline.
            times[-1] = at
            return
        self._start = at
        times.append(at)
        values.append(value)

    def since(self, at: float) -> float | None:
        """The highest value that came after `at`; None when none did."""
        i = bisect.bisect_right(self._times, at, self._head)
        return self._values[i] if i < len(self._values) else None

    def forget(self, before: float) -> None:
        times = self._times
        while self._head < len(times) and times[self._head] < before:
            self._head += 1
        if self._head > 64 and self._head * 2 > len(times):
            del times[:self._head]
            del self._values[:self._head]
            self._head = 0


class DeadlineMiss(RequestFailed):
    """A copy given up at its deadline after `elapsed_s`. With `tokens` (not None) the server
    confirmed it: it answered finish_reason abort to our `/abort_request` with that many
    tokens generated, and holds nothing of it any more."""

    def __init__(self, message: str, elapsed_s: float, tokens: int | None) -> None:
        super().__init__("deadline", message, True, True)
        self.elapsed_s = elapsed_s
        self.tokens = tokens

    @property
    def confirmed(self) -> bool:
        return self.tokens is not None


async def send_within(client: ServerClient, payload: dict[str, Any],
                      deadline: Callable[[], Deadline | None], factor: float,
                      abort: Callable[[], Awaitable[bool]],
                      changed: Callable[[], asyncio.Future[None]] | None = None) -> Completion:
    """The chat request, given up when it runs past its deadline: DeadlineMiss. `deadline()`
    is asked at the start and again when the deadline comes, on a timer beside the request (a
    callback, not a task woken): when it has grown, the timer is set again. While none is
    known it is asked only when `changed()` says a pace may be (without `changed`, every
    RECHECK_S). The request runs in the caller's task. The deadline only ever grows: the pace
    of the answers coming in rises as the batch in flight shrinks (at the tail), and a request
    that ran its first part in the full batch, or waited in a long queue, is not late by the
    pace and queue of the moment (`Pace.longest` gives the longest since it was sent).

    At the deadline `abort()` asks the server to let the request go (True when it took the
    request), and the server's own answer to it, finish_reason abort, is waited for up to
    ABORT_CONFIRM_S: then the server holds nothing of it. An answer that comes instead (it
    ended before the abort reached it) is the result. The HTTP request is cancelled on the way
    out (a deadline, an unconfirmed abort, or the caller's cancellation)."""
    task = asyncio.current_task()
    assert task is not None
    watch = _Watch(task, deadline, factor, abort, changed)
    watch.arm()
    try:
        result = await chat(client, payload)
    except Aborted as exc:
        if watch.message is None:
            raise
        raise DeadlineMiss(f"{watch.message}; aborted on the server after "
                           f"{exc.completion_tokens} tokens", watch.waited,
                           exc.completion_tokens) from None
    except RequestFailed:
        if watch.message is None:
            raise
        raise DeadlineMiss(f"{watch.message}; the server did not confirm the abort",
                           watch.waited, None) from None
    except asyncio.CancelledError:
        if watch.cut and task.uncancel() == 0:  # ours alone, not the caller's too
            assert watch.message is not None
            raise DeadlineMiss(f"{watch.message}; the server did not confirm the abort",
                               watch.waited, None) from None
        raise
    finally:
        watch.close()
        # The task keeps the exception that ends it, whose traceback holds this frame: a frame
        # holding the task (or the watch, which does) would make a cycle of every copy ended
        # by an exception or a cancellation (a hedge's loser), freed only by a full collection.
        del task, watch
    return result  # an answer past the deadline, while its abort was on the way, stands


class _Watch:
    """A copy's deadline beside its request: a timer (or a wait for the pace to be known)
    that, when the deadline comes and has not grown, gives the request up in a task of its
    own: the abort, the wait for its confirmation, and the request's cancellation when none
    comes."""

    def __init__(self, task: asyncio.Task[Any], deadline: Callable[[], Deadline | None],
                 factor: float, abort: Callable[[], Awaitable[bool]],
                 changed: Callable[[], asyncio.Future[None]] | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = task
        self.deadline = deadline
        self.factor = factor
        self.abort = abort
        self.changed = changed
        self.start = time.monotonic()
        self.fixed: Deadline | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.wake: asyncio.Future[None] | None = None
        self.giving_up: asyncio.Task[None] | None = None
        self.ended = False
        self.cut = False  # the request cancelled by the give-up, not by the caller
        self.message: str | None = None  # set once given up
        self.waited = 0.0

    def arm(self, _: Any = None) -> None:
        self.timer = self.wake = None
        if self.ended:
            return
        d = self.deadline()
        if d is not None and (self.fixed is None or d.seconds > self.fixed.seconds):
            self.fixed = d
        if self.fixed is not None:
            left = self.start + self.fixed.seconds - time.monotonic()
            if left > 0:
                # Asked again when it comes: `deadline()` is the longest it had since the copy
                # was sent (Pace.longest), so a server's queue that came and went while the
                # copy waited in it still counts (asked only at the deadline without them,
                # the real server short of KV room gave up 120, then 54 copies:
                # tests/real/test_kv_pressure.py), and nothing wakes in between.
                self.timer = self.loop.call_later(left, self.arm)
                return
            self.waited = time.monotonic() - self.start
            self.message = f"no answer after {self.waited:.1f} s ({self.fixed.why(self.factor)})"
            self.giving_up = self.loop.create_task(self._give_up())
        elif self.changed is not None:
            self.wake = self.changed()
            self.wake.add_done_callback(self.arm)
        else:
            self.timer = self.loop.call_later(RECHECK_S, self.arm)

    async def _give_up(self) -> None:
        if await self.abort() and not self.ended:
            # The request's own end (its answer, or finish_reason abort) cancels this wait.
            await asyncio.sleep(ABORT_CONFIRM_S)
        if not self.ended:
            self.cut = True
            self.task.cancel()

    def close(self) -> None:
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
        if self.wake is not None:
            self.wake.remove_done_callback(self.arm)
            self.wake.cancel()  # done: Pace drops it
        self.timer = self.wake = None
        g = self.giving_up
        if g is not None and not g.done() and g is not asyncio.current_task():
            g.cancel()
        # The give-up task, cancelled, keeps its CancelledError, whose traceback holds its
        # frame and so this watch: not referred to back, or they make a cycle.
        self.giving_up = None
