"""The engine's progress record: the run as it stands (`progress_of`: one Progress, built in
O(1) of the run's size from the engine's parts) and the heartbeat that writes it:
progress.json each PROGRESS_INTERVAL_S (atomic, not fsynced: no total is read back from it),
a sample to history.jsonl every HISTORY_INTERVAL_S and totals.json every recount.SYNC_S
(both fsynced, in a thread); a full disk is said once and waited out."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agents.engine import recount
from agents.engine.accounting import server_progress
from agents.rundir.atomic import AppendLog, atomic_write
from agents.rundir.schema import Progress, QueueProgress

if TYPE_CHECKING:
    from agents.engine.run import Engine

log = logging.getLogger("fleetdeck.engine")

PROGRESS_INTERVAL_S = float(os.environ.get("FLEETDECK_PROGRESS_INTERVAL_S", "1.0"))
# Tests and demos that need a history of many samples in seconds set it lower.
HISTORY_INTERVAL_S = float(os.environ.get("FLEETDECK_HISTORY_INTERVAL_S", "10.0"))


class Heartbeat:
    """progress.json, history.jsonl and totals.json of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.error: str | None = None
        self._history: AppendLog | None = None
        self._last_history = 0.0
        self._last_totals = time.monotonic()

    def failed(self, what: str, exc: OSError) -> None:
        # A full disk: the heartbeat waits for space (said once, not every second); the
        # run itself stops only when a completion cannot be stored.
        if self.error is None:
            log.error("cannot write %s in %s: %s", what, self.run_dir, exc.strerror or exc)
        self.error = str(exc)

    def write(self, snap: bytes, durable: bool = False) -> bytes | None:
        """progress.json; the bytes written, None when they could not be."""
        try:
            atomic_write(self.run_dir / "progress.json", snap, durable=durable)
        except OSError as exc:
            self.failed("progress.json", exc)
            return None
        self.error = None
        return snap

    def sync_totals(self, rec: recount.TotalsRecord) -> None:
        """totals.json, fsynced (blocking: the loop hands it to a thread)."""
        try:
            recount.write_record(self.run_dir, rec)
        except OSError as exc:
            self.failed(recount.FILE, exc)

    def append_history(self, snap: bytes) -> None:
        """A status sample appended to history.jsonl and fsynced (blocking: from a thread)."""
        try:
            if self._history is None:
                self._history = AppendLog(self.run_dir / "history.jsonl")
            self._history.append_durable(snap + b"\n")
        except OSError as exc:
            self.failed("history.jsonl", exc)

    async def beat(self, snap: bytes | None, now: float,
                   totals: Callable[[], recount.TotalsRecord]) -> None:
        """After progress.json: the history sample and totals.json when theirs are due."""
        if snap is not None and now - self._last_history >= HISTORY_INTERVAL_S:
            self._last_history = now
            await asyncio.to_thread(self.append_history, snap)
        if now - self._last_totals >= recount.SYNC_S:
            self._last_totals = now
            await asyncio.to_thread(self.sync_totals, totals())

    def close(self) -> None:
        if self._history is not None:
            self._history.close()
            self._history = None


def progress_of(e: Engine) -> Progress:
    """The run as it stands: what progress.json, the status push and `status` show."""
    t = e.meter.totals
    completed = len(e.store.done)
    failed_n = e._failed_count()
    total = e.pin.prompts_lines
    queue = None
    if e.queue is not None:
        qs = e.queue.summary()
        total = completed + failed_n + qs["to_do_here"]
        assert e.spec.queue is not None
        queue = QueueProgress(node=e.spec.queue.node, run_id=e.queue.board.me.run_id,
                              finished=e.queue.finished, **qs)
    up = e.uploader
    servers = dict(
        server_progress(s.number, s.url, s.state, s.in_flight, s.limit, s.completed, s.failed,
                        s.req_rate.rate, s.tok_rate.rate, s.accept_length, s.errors_in_row,
                        s.last_error)
        for s in e.servers
    )
    for s in e.servers:
        servers[str(s.number)].autotune = e.autotune.state(s.number)
    assert e.control is not None
    return e.meter.annotate(Progress(
        total=total, completed=completed, failed=failed_n,
        rate_per_sec=round(e.meter.rate.rate, 3),
        eta_hours=e.meter.eta_hours(total - completed - failed_n),
        total_input_tokens=t.input_tokens, total_output_tokens=t.output_tokens,
        avg_output_tokens=round(t.output_tokens / completed, 1) if completed else 0.0,
        elapsed_hours=round((time.time() - e.meter.started_at) / 3600, 4),
        s3_uploaded=len(up.uploaded) if up else 0, s3_bytes=up.bytes if up else 0,
        status=e.status,  # type: ignore[arg-type]
        truncated=t.truncated, empty=t.empty, max_tokens=e.control.max_tokens,
        concurrency=e.control.concurrency.default,
        in_flight=sum(s.in_flight for s in e.servers), retried=t.retried,
        s3_pending=up.pending if up else 0, control_rev=e._applied_rev,
        updated_at=time.time(), servers=servers, run=e.spec.run.name, pid=os.getpid(),
        started_at=e.meter.started_at, total_reasoning_tokens=t.reasoning_tokens,
        bad_input=e.journal.state.bad_input, paused=e.dispatcher.paused,
        s3_error=up.last_error if up else None, batches_closed=e._batches_closed,
        message=e.message or e._control_note, tail=e.tail, hedges=e.hedger.sent,
        hedges_won=e.hedges_won, deadline_misses=e.deadline_misses,
        aborts_confirmed=e.aborts_confirmed, late_answers=e.late_answers,
        busy_answers=e.busy_answers,
        loop_lag_ms=round(e.lag.recent_ms(), 1), loop_lag_max_ms=round(e.lag.worst_ms, 1),
        loop_lag_max_cpu_ms=round(e.lag.worst_cpu_ms, 1),
        loop_lag_max_wait_ms=round(e.lag.worst_wait_ms, 1),
        loop_lag_own_max_ms=round(e.lag.worst_own_ms, 1),
        answers_by_limit=dict(t.answers_by_limit),
        truncated_by_limit=dict(t.truncated_by_limit), truncated_loops=t.loops,
        campaign=e.spec.run.campaign, queue=queue,
    ))

