"""The run's totals after any stop, a power loss included: totals.json, fsynced every SYNC_S
seconds with the point in the batch store it has counted up to, plus a recount of the lines
written after that point.

What each total comes from:
- tokens, lines, truncated, loops among them (told from each line's text by loops.py), empty,
  answers and truncations by max_tokens: the batch lines (the record only saves reading the
  lines before its point, and keeps which indices' current lines are truncated and which
  loops, compressed), so they are exact after any crash;
- completed and failed: .done_indices and failures.jsonl (the store and the journal);
- GPU-hours and retries within a request, which no line holds: the newer of totals.json and a
  readable progress.json, so a kill -9 loses about a second of them and a power loss at most
  SYNC_S (progress.json is not fsynced; totals.json is).
progress.json is the heartbeat for readers; no line total is read back from it.
"""

from __future__ import annotations

import base64
import logging
import os
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from agents.engine.accounting import Totals
from agents.engine.loops import answer_tail, is_loop
from agents.engine.store import BatchStore, StoreError
from agents.rundir.atomic import atomic_write
from agents.rundir.schema import Progress, Usage, progress_decoder

log = logging.getLogger("fleetdeck.engine")

FILE = "totals.json"
# How often totals.json is fsynced: what a power loss may cost of GPU-hours (tests shorten it).
SYNC_S = float(os.environ.get("FLEETDECK_TOTALS_SYNC_S", "30"))


class TotalsRecord(msgspec.Struct, forbid_unknown_fields=True):
    """totals.json: the totals of every line before line `line` of batch `batch`."""

    batch: int
    line: int
    lines: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    truncated: int
    empty: int
    answers_by_limit: dict[str, int]
    truncated_by_limit: dict[str, int]
    retried: int
    gpu_hours: float
    written_at: float
    # Totals.cut (a bit per index: its current line is truncated), zlib, base64. None in a
    # record written before it was kept: such a record cannot carry `truncated` on.
    cut: str | None = None
    # Loops among the truncated (loops.py) and Totals.looped, coded as `cut`. None in a record
    # written before loops were told apart: such a record cannot carry `loops` on.
    loops: int = 0
    looped: str | None = None

    def totals(self) -> Totals:
        return Totals(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                      reasoning_tokens=self.reasoning_tokens, truncated=self.truncated,
                      empty=self.empty, retried=self.retried, lines=self.lines,
                      gpu_hours=self.gpu_hours, answers_by_limit=dict(self.answers_by_limit),
                      truncated_by_limit=dict(self.truncated_by_limit),
                      cut=_bits(self.cut), loops=self.loops, looped=_bits(self.looped))


def _bits(coded: str | None) -> bytearray:
    return bytearray(zlib.decompress(base64.b64decode(coded)) if coded else b"")


def _coded(bits: bytearray) -> str:
    return base64.b64encode(zlib.compress(bytes(bits), 1)).decode()


def record_of(t: Totals, at: tuple[int, int], gpu_hours: float) -> TotalsRecord:
    """The record of `t`, which has counted every line before `at` (batch, line)."""
    return TotalsRecord(batch=at[0], line=at[1], lines=t.lines, input_tokens=t.input_tokens,
                        output_tokens=t.output_tokens, reasoning_tokens=t.reasoning_tokens,
                        truncated=t.truncated, empty=t.empty,
                        answers_by_limit=dict(t.answers_by_limit),
                        truncated_by_limit=dict(t.truncated_by_limit), retried=t.retried,
                        gpu_hours=round(gpu_hours, 6), written_at=time.time(),
                        cut=_coded(t.cut), loops=t.loops, looped=_coded(t.looped))


_record_decoder = msgspec.json.Decoder(TotalsRecord)


def write_record(run_dir: Path, rec: TotalsRecord) -> None:
    """Durably (blocking: the engine calls it from a thread)."""
    atomic_write(run_dir / FILE, msgspec.json.encode(rec))


class _Counted(msgspec.Struct):
    """The fields of a batch line the totals need, decoded without the rest."""

    index: int
    finish_reason: str
    usage: Usage
    max_tokens: int = 0
    attempt: int = 1
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[msgspec.Raw] | None = None


_line_decoder = msgspec.json.Decoder(_Counted)


def add_lines(t: Totals, lines: Iterable[tuple[Path, int, bytes]],
              bad: list[str] | None = None) -> int:
    """Count batch lines (file, line number, line) into `t` by the rule live counting
    follows; returns how many. A line that does not parse is named in `bad` and skipped
    (verify reports it too), or is a StoreError without `bad`."""
    n = 0
    for path, lineno, raw in lines:
        try:
            c = _line_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            if bad is None:
                raise StoreError(f"{path}:{lineno}: unreadable batch line: {exc}") from None
            bad.append(f"{path.name}:{lineno}")
            continue
        u = c.usage
        loop = c.finish_reason == "length" and is_loop(answer_tail(c.content,
                                                                   c.reasoning_content))
        t.add_line(u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, c.finish_reason,
                   c.max_tokens, c.attempt, not c.content and not c.tool_calls, c.index, loop)
        n += 1
    return n


@dataclass(slots=True)
class Recounted:
    totals: Totals
    counted_at: tuple[int, int]  # the store's end: every line before it is in `totals`
    recounted: int  # lines read to get there
    notes: list[str]
    warnings: list[str]

    @property
    def record_stale(self) -> bool:
        """totals.json lags the lines: write it again now, before the run goes on."""
        return self.recounted > 0 or any("totals.json" in w for w in self.warnings)


def _read_record(path: Path, warnings: list[str]) -> TotalsRecord | None:
    try:
        return _record_decoder.decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        # Written only by an fsynced replace: unreadable means damaged, not torn by a crash.
        warnings.append(f"{path}: unreadable ({exc}): every line counted again")
        return None


def _read_progress(raw: bytes | None) -> tuple[Progress | None, str | None]:
    if raw is None:
        return None, "missing"
    try:
        return progress_decoder.decode(raw), None
    except msgspec.DecodeError as exc:
        return None, f"unreadable ({len(raw)} bytes: torn by a crash?): {exc}"


def recover_totals(run_dir: Path, store: BatchStore, progress_raw: bytes | None,
                   done: int) -> Recounted:
    """The totals of a run whose store has just recovered (`done`: its completed count):
    totals.json plus the lines after its point, or every line when there is no usable
    record; GPU-hours and retries from the newer of totals.json and progress.json."""
    notes: list[str] = []
    warnings: list[str] = []
    path = run_dir / FILE
    rec = _read_record(path, warnings)
    end = (store.next_number, store.open_lines)
    t, start = Totals(), (0, 0)
    if rec is not None:
        try:
            t, start = rec.totals(), (rec.batch, rec.line)
        except (ValueError, zlib.error) as exc:
            warnings.append(f"{path}: its truncated bits are unreadable ({exc}): every line "
                            "counted again")
            t = Totals(gpu_hours=rec.gpu_hours, retried=rec.retried)
        if rec.cut is None and rec.truncated:
            # Which indices' lines are the truncated ones is what a later line superseding
            # one needs to know; a record from before it was kept cannot say.
            warnings.append(f"{path} keeps no truncated bits (an older engine wrote it): every "
                            "line counted again")
            t, start = Totals(gpu_hours=rec.gpu_hours, retried=rec.retried), (0, 0)
        elif rec.looped is None and rec.truncated:
            # Which truncated lines are loops is told from their text: count them again.
            warnings.append(f"{path} keeps no loop bits (an older engine wrote it): every "
                            "line counted again")
            t, start = Totals(gpu_hours=rec.gpu_hours, retried=rec.retried), (0, 0)
    missing: list[str] = []
    bad: list[str] = []
    try:
        n = add_lines(t, store.lines_from(*start, missing), bad)
    except StoreError as exc:
        # Only a record can point past the store (a full recount starts at its beginning).
        assert rec is not None, exc
        warnings.append(f"{path} does not fit the batches ({exc}): every line counted again")
        t, start = Totals(gpu_hours=rec.gpu_hours, retried=rec.retried), (0, 0)
        missing, bad = [], []
        n = add_lines(t, store.lines_from(0, 0, missing), bad)
    for what, names in (("closed batches gone from the folder", missing),
                        ("unreadable batch lines", bad)):
        if names:
            warnings.append(f"{what}, not in the totals: {', '.join(names[:10])}"
                            f"{f' and {len(names) - 10} more' if len(names) > 10 else ''}")
    if rec is None:
        notes.append(f"no {FILE}: totals counted from all {n} lines")
    else:
        notes.append(f"totals from {FILE} (batch {start[0]} line {start[1]}) and the {n} "
                     "lines written after it")
    progress, problem = _read_progress(progress_raw)
    if progress is not None:
        # What no line holds: the newer of the two. Both are true values at some past
        # moment of counters that only grow, so the larger is never an over-count.
        t.gpu_hours = max(t.gpu_hours, progress.gpu_hours)
        t.retried = max(t.retried, progress.retried)
        behind = [f"{what} {had:,} of {now:,}" for what, had, now in (
            ("completed", progress.completed, done),
            ("output tokens", progress.total_output_tokens, t.output_tokens),
            ("input tokens", progress.total_input_tokens, t.input_tokens),
            ("truncated", progress.truncated, t.truncated)) if had != now]
        if behind:
            warnings.append(f"progress.json was stale ({', '.join(behind)}): rebuilt from the "
                            "batch lines, .done_indices and failures.jsonl")
    elif problem == "missing" and (n or rec is not None):
        warnings.append("progress.json was missing: rebuilt from the batch lines, "
                        ".done_indices and failures.jsonl")
    elif problem != "missing":
        warnings.append(f"progress.json was {problem}: rebuilt from the batch lines, "
                        ".done_indices and failures.jsonl")
    if rec is None and progress is None and (n or done):
        warnings.append("GPU-hours and retries of earlier engines are unknown (no "
                        f"{FILE}, no readable progress.json): counted from 0")
    return Recounted(t, end, n, notes, warnings)


def log_recount(r: Recounted) -> None:
    for w in r.warnings:
        log.warning("%s", w)
    t = r.totals
    log.info("%s: %d lines, %d output tokens, %d truncated, %.4f GPU-hours", "; ".join(r.notes),
             t.lines, t.output_tokens, t.truncated, t.gpu_hours)


__all__ = ["FILE", "SYNC_S", "Recounted", "TotalsRecord", "add_lines", "log_recount",
           "record_of", "recover_totals", "write_record"]
