"""The run's one history store: history.jsonl (the engine's samples, one every 10 s) and beside
it history.compact.jsonl, the same samples folded into 1 min buckets for the run's last day,
10 min before that and 1 h past 30 days, so that a window of any span is served without
reading the whole run. `read_history` is the reader for everyone: the `history` RPC, the
accept-drift alerts, replay and reports.

The compacted copy is derived and rebuildable: appended under a flock by whichever process
reads or refreshes the store (the supervisor every HISTORY_REFRESH_S, or `serve` answering
from disk), rewritten whole (temp + os.replace) only when old buckets fold into coarser ones.
A torn or corrupt copy is rebuilt from history.jsonl; a torn last line of history.jsonl is
left until its writer finishes it.
"""

from __future__ import annotations

import fcntl
import math
import os
import stat
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import msgspec

RAW = "history.jsonl"
COMPACT = "history.compact.jsonl"
LOCK = "history.compact.lock"

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
# (age at least, bucket seconds): how fine the copy keeps the run; age counts back from the
# newest sample, so a finished run keeps its last day at 1 min.
COMPACT_TIERS: tuple[tuple[float, int], ...] = ((0.0, 60), (DAY, 600), (30 * DAY, 3600))
# What a window serves at best: the raw samples (10 s) for the last hour, then the copy's.
SERVED_TIERS: tuple[tuple[float, int], ...] = ((0.0, 10), (HOUR, 60), *COMPACT_TIERS[1:])
# Steps a window may be coarsened to so that it fits its limit: each divides the next tier's.
LADDER = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600, 43200, 86400)
SPANS: dict[str, float | None] = {"1h": HOUR, "6h": 6 * HOUR, "all": None}
SPAN_STEP: dict[str, int | None] = {"1h": 10, "6h": 60, "all": None}  # None: fit the limit
MAX_LIMIT = 5000  # items in one reply: a window past it is served coarser
FOLD_SLACK = 60  # buckets past their tier before the copy is rewritten (an hour of 1 min)
MAX_COMPACT_BYTES = 256 * 2**20  # a copy larger than this is not read: it is rebuilt
CHUNK = 1 << 20
MAX_LINE = 4 * CHUNK  # a history line longer than this is not a sample: skipped, counted

# How a bucket sums its samples up; every other field is the last sample's value (totals,
# counters, words). Means are weighted by the samples each part holds.
MEAN = ("rate_per_sec", "eta_hours", "eta_p10_hours", "eta_p90_hours", "loop_lag_ms")
MAX = ("in_flight", "s3_pending", "loop_lag_max_ms")
SERVER_MEAN = ("req_per_s", "tok_per_s", "accept_length")
SERVER_MAX = ("in_flight", "errors_in_row")
BUCKET_KEYS = ("bucket_s", "bucket_start", "samples", "first_at")


class HistoryError(ValueError):
    """A window asked for wrongly: the message names the parameter."""


def _num(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def sample_time(obj: Any) -> float | None:
    """A sample's `updated_at`, or None when the line is not a sample."""
    at = obj.get("updated_at") if isinstance(obj, dict) else None
    return float(at) if _num(at) else None


def _weight(obj: dict[str, Any]) -> int:
    n = obj.get("samples")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def _mean(parts: list[tuple[Any, int]]) -> float | None:
    got = [(v, n) for v, n in parts if _num(v)]
    total = sum(n for _, n in got)
    return round(sum(v * n for v, n in got) / total, 4) if total else None


def fold(parts: list[dict[str, Any]], start: float, step: int) -> dict[str, Any]:
    """One bucket of `step` seconds from `start`, made of samples or smaller buckets (oldest
    first): the last one's fields, rates averaged, in-flight and queues at their maximum."""
    last = parts[-1]
    out = {k: v for k, v in last.items() if k != "src_end"}
    weights = [_weight(p) for p in parts]
    for key in MEAN:
        if any(key in p for p in parts):
            out[key] = _mean([(p.get(key), n) for p, n in zip(parts, weights, strict=True)])
    for key in MAX:
        got = [p[key] for p in parts if _num(p.get(key))]
        if got:
            out[key] = max(got)
    servers: dict[str, dict[str, Any]] = {}
    for p in parts:
        srv = p.get("servers")
        if isinstance(srv, dict):
            for name, row in srv.items():
                if isinstance(row, dict):
                    servers[name] = row  # the last row each server had
    if servers or "servers" in out:
        rows: dict[str, Any] = {}
        for name, row in servers.items():
            merged = dict(row)
            seen = [(p["servers"][name], n) for p, n in zip(parts, weights, strict=True)
                    if isinstance(p.get("servers"), dict)
                    and isinstance(p["servers"].get(name), dict)]
            for key in SERVER_MEAN:
                merged[key] = _mean([(r.get(key), n) for r, n in seen])
            for key in SERVER_MAX:
                got = [r[key] for r, _ in seen if _num(r.get(key))]
                if got:
                    merged[key] = max(got)
            rows[name] = merged
        out["servers"] = rows
    firsts = [f for p in parts if _num(f := p.get("first_at", p.get("updated_at")))]
    out.update(bucket_s=step, bucket_start=start, samples=sum(weights),
               first_at=min(firsts) if firsts else start)
    ends = [p["src_end"] for p in parts if isinstance(p.get("src_end"), int)]
    if ends:  # the copy's: how far into history.jsonl its buckets reach
        out["src_end"] = max(ends)
    return out


def _tier(tiers: tuple[tuple[float, int], ...], age: float) -> int:
    step = tiers[0][1]
    for at_least, s in tiers:
        if age >= at_least:
            step = s
    return step


def _start(obj: dict[str, Any]) -> float:
    """Where a sample or bucket sits in time: a bucket's start, a sample's time."""
    b = obj.get("bucket_start")
    return float(b) if _num(b) else float(obj["updated_at"])


def refold(units: Iterable[dict[str, Any]], step_at: Any) -> list[dict[str, Any]]:
    """Samples or buckets (oldest first) folded into buckets whose size `step_at(unit)` gives
    (never finer than a unit already is); a unit alone at its size stays as it is."""
    out: list[dict[str, Any]] = []
    group: list[dict[str, Any]] = []
    key: tuple[int, float] | None = None
    for u in units:
        step = max(step_at(u), int(u.get("bucket_s") or 0))
        k = (step, math.floor(_start(u) / step) * step)
        if key is not None and k != key:
            out.append(_close(group, key))
            group = []
        key = k
        group.append(u)
    if group and key is not None:
        out.append(_close(group, key))
    return out


def _close(group: list[dict[str, Any]], key: tuple[int, float]) -> dict[str, Any]:
    step, start = key
    if len(group) == 1 and group[0].get("bucket_s") == step:
        return group[0]
    return fold(group, start, step)


@dataclass(slots=True)
class HistoryWindow:
    """What `read_history` serves: items oldest first, each a sample as history.jsonl holds it
    (a progress.json dict) summed up over its bucket (`bucket_s`, `bucket_start`, `samples`,
    `first_at`; `updated_at` is its last sample's)."""

    items: list[dict[str, Any]]
    span: str
    step_s: int  # the step asked for, or the one the limit forced; older parts may be coarser
    since: float | None
    until: float | None  # the newest sample's time
    more: bool = False  # items older than these were left out: the limit was reached
    bad_lines: int = 0
    refused: str | None = None

    def reply(self) -> dict[str, Any]:
        out: dict[str, Any] = {"items": self.items, "span": self.span, "step_s": self.step_s,
                               "since": self.since, "until": self.until, "more": self.more,
                               "bad_lines": self.bad_lines}
        if self.refused is not None:
            out["refused"] = self.refused
        return out


class RefusedFile(OSError):
    """history.jsonl is a symlink or not a regular file: never read."""


def _open_raw(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise RefusedFile(f"{path}: a symbolic link; refused") from None
        raise RefusedFile(f"{path}: {exc.strerror}; refused") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RefusedFile(f"{path}: not a regular file; refused")
    return fd


def _lines(fd: int, offset: int) -> Iterator[tuple[int, bytes]]:
    """(end offset, line) of each whole line from `offset`; a last line with no newline yet
    (its writer is still on it, or died in it) is left."""
    pos = offset
    rest = b""
    skipping = False  # inside a line past MAX_LINE: not held, given back as one bad line
    while True:
        data = os.pread(fd, CHUNK, pos)
        if not data:
            return
        pos += len(data)
        data = rest + data
        start = 0
        base = pos - len(data)
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            yield base + nl + 1, (b"\x00" if skipping else data[start:nl])
            skipping = False
            start = nl + 1
        rest = data[start:]
        if len(rest) > MAX_LINE:
            rest, skipping = b"", True


_decode = msgspec.json.Decoder()


def _parse(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        obj = _decode.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    return obj if sample_time(obj) is not None else None


def _valid_bucket(obj: Any) -> bool:
    return (isinstance(obj, dict) and sample_time(obj) is not None
            and obj.get("bucket_s") in {s for _, s in COMPACT_TIERS}
            and _num(obj.get("bucket_start")) and isinstance(obj.get("src_end"), int)
            and not isinstance(obj.get("src_end"), bool) and obj["src_end"] >= 0
            and isinstance(obj.get("samples"), int) and obj["samples"] >= 1)


@dataclass(slots=True)
class _Recent:
    end: int  # history.jsonl offset after this sample's line
    sample: dict[str, Any]


@dataclass
class HistoryStore:
    """One run directory's store, cached between calls (see `store_for`)."""

    run_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list)  # the copy's buckets
    recent: deque[_Recent] = field(default_factory=deque)  # raw samples, the last hour or so
    raw_offset: int = 0
    bad_lines: int = 0
    writable: bool = True  # False: the copy is kept in memory only (a read-only run dir)
    recent_from: int = 0  # `recent` holds every sample whose line ends past this offset
    _loaded: bool = False
    _counted_to: int = 0  # bad lines are counted up to this offset of history.jsonl
    _copy_id: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) as last seen
    _raw_id: int | None = None
    _mutex: threading.Lock = field(default_factory=threading.Lock)

    @property
    def raw(self) -> Path:
        return self.run_dir / RAW

    @property
    def copy(self) -> Path:
        return self.run_dir / COMPACT

    # -- the compacted copy on disk ---------------------------------------------------------

    def _copy_stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.lstat(self.copy)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None

    def _read_copy(self) -> tuple[list[dict[str, Any]], bool]:
        """The copy's buckets and whether they are all sound (False: missing, not a regular
        file, too large, a corrupt line, out of order, or a torn end)."""
        try:
            fd = os.open(self.copy, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return [], False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_COMPACT_BYTES:
            os.close(fd)
            return [], False
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        records: list[dict[str, Any]] = []
        lines = data.split(b"\n")
        torn = lines.pop() != b""
        for line in lines:
            try:
                obj = _decode.decode(line)
            except (msgspec.DecodeError, RecursionError):
                return records, False
            if not _valid_bucket(obj) or (records and (
                    obj["bucket_start"] < records[-1]["bucket_start"]
                    or obj["src_end"] < records[-1]["src_end"])):
                return records, False
            records.append(obj)
        return records, not torn

    def _write_copy(self, records: list[dict[str, Any]]) -> None:
        """The whole copy replaced (temp + os.replace: a reader sees the old or the new)."""
        if not self.writable:
            return
        tmp = self.copy.with_name(f".{COMPACT}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(b"".join(msgspec.json.encode(r) + b"\n" for r in records))
            os.replace(tmp, self.copy)
        except OSError:
            self.writable = False
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _append_copy(self, records: list[dict[str, Any]]) -> None:
        if not self.writable or not records:
            return
        data = b"".join(msgspec.json.encode(r) + b"\n" for r in records)
        try:
            fd = os.open(self.copy, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError:
            self.writable = False

    # -- keeping up with history.jsonl ------------------------------------------------------

    def _rebuild(self, fd: int) -> list[dict[str, Any]]:
        """The copy made again from the whole of history.jsonl (streamed, a minute at once)."""
        records: list[dict[str, Any]] = []
        group: list[dict[str, Any]] = []
        minute: float | None = None
        for end, line in _lines(fd, 0):
            obj = _parse(line)
            if obj is None:
                self._bad(end, line)
                continue
            m = math.floor(obj["updated_at"] / MINUTE) * MINUTE
            if minute is not None and m != minute:
                if m < minute:
                    continue  # a clock that went back: the sample stays in history.jsonl only
                records.append(group_bucket(group, minute))
                group = []
            minute = m
            obj["src_end"] = end
            group.append(obj)
        # The last minute stays open: the next catch-up (or a reader's tail) has it.
        return self._tiered(records)

    def _tiered(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not records:
            return records
        newest = records[-1]["updated_at"]
        return refold(records, lambda u: _tier(COMPACT_TIERS, newest - _start(u)))

    def _load(self, fd: int | None, size: int) -> None:
        records, sound = self._read_copy()
        if not sound or (records and records[-1]["src_end"] > size):
            records = self._rebuild(fd) if fd is not None else []
            self._write_copy(records)
        self.records = records
        # The raw samples of the last hour, read from the bucket that starts it.
        start = 0
        if records:
            horizon = records[-1]["updated_at"] - HOUR - 2 * MINUTE
            for r in reversed(records):
                if r["updated_at"] <= horizon:
                    start = r["src_end"]
                    break
        self.recent.clear()
        self.raw_offset = self.recent_from = start

    def catch_up(self) -> None:
        """Fold the samples history.jsonl gained since the last call into the copy."""
        with self._mutex:
            self._catch_up()

    def _catch_up(self) -> None:
        fd = _open_raw(self.raw)
        try:
            size = os.fstat(fd).st_size if fd is not None else 0
            raw_id = os.fstat(fd).st_ino if fd is not None else None
            with self._locked():
                if not self._loaded or raw_id != self._raw_id or size < self.raw_offset or \
                        (self.writable and self._copy_stat() != self._copy_id):
                    if raw_id != self._raw_id or size < self.raw_offset:
                        self.bad_lines = self._counted_to = 0  # another history.jsonl
                    self._load(fd, size)
                    self._raw_id = raw_id
                    self._loaded = True
                if fd is not None:
                    self._read_new(fd)
                self._close_minutes()
                self._copy_id = self._copy_stat()
        finally:
            if fd is not None:
                os.close(fd)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The copy's writers one at a time (the supervisor, `serve` sessions): a flock."""
        fd: int | None = None
        if self.writable:
            try:
                fd = os.open(self.run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                self.writable = False  # a read-only run dir: the copy is kept in memory
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)

    def _read_new(self, fd: int) -> None:
        for end, line in _lines(fd, self.raw_offset):
            self.raw_offset = end
            obj = _parse(line)
            if obj is None:
                self._bad(end, line)
                continue
            self.recent.append(_Recent(end, obj))
        if self.recent:
            horizon = self.recent[-1].sample["updated_at"] - HOUR - 2 * MINUTE
            last_end = self.records[-1]["src_end"] if self.records else 0
            while self.recent and self.recent[0].sample["updated_at"] < horizon and \
                    self.recent[0].end <= last_end:
                self.recent_from = self.recent.popleft().end

    def _bad(self, end: int, line: bytes) -> None:
        """Count a line that is not a sample once, however many passes read it."""
        if end > self._counted_to and line.strip():
            self.bad_lines += 1
        self._counted_to = max(self._counted_to, end)

    def _open_tail(self) -> list[_Recent]:
        """The raw samples not yet in a bucket of the copy."""
        last_end = self.records[-1]["src_end"] if self.records else 0
        return [r for r in self.recent if r.end > last_end]

    def _close_minutes(self) -> None:
        tail = self._open_tail()
        if not tail:
            return
        floor_t = self.records[-1]["bucket_start"] + self.records[-1]["bucket_s"] \
            if self.records else -math.inf
        closed: list[dict[str, Any]] = []
        group: list[dict[str, Any]] = []
        minute: float | None = None
        for r in tail:
            m = math.floor(r.sample["updated_at"] / MINUTE) * MINUTE
            if m < floor_t or (minute is not None and m < minute):
                continue  # a clock that went back: history.jsonl keeps it
            if minute is not None and m != minute:
                closed.append(group_bucket(group, minute))
                group = []
            minute = m
            group.append({**r.sample, "src_end": r.end})
        if not closed:
            return
        self.records.extend(closed)
        newest = self.records[-1]["updated_at"]
        overdue = sum(1 for r in self.records
                      if r["bucket_s"] < _tier(COMPACT_TIERS, newest - _start(r)))
        if overdue >= FOLD_SLACK:
            self.records = self._tiered(self.records)
            self._write_copy(self.records)
        else:
            self._append_copy(closed)

    # -- serving a window -------------------------------------------------------------------

    def window(self, span: str = "1h", since: float | None = None,
               resolution: int | None = None, limit: int = 1000) -> HistoryWindow:
        if not isinstance(span, str) or span not in SPANS:
            raise HistoryError(f"span must be one of {', '.join(SPANS)}, got {span!r}")
        if resolution is not None and (resolution < 10 or resolution % 10):
            raise HistoryError(f"resolution must be a multiple of 10 s, got {resolution!r}")
        if not 1 <= limit <= MAX_LIMIT:
            raise HistoryError(f"limit must be 1..{MAX_LIMIT}, got {limit!r}")
        with self._mutex:
            self._catch_up()
            units = self._units()
        until = units[-1]["updated_at"] if units else None
        asked = resolution or SPAN_STEP[span]
        lo = -math.inf
        if until is not None and SPANS[span] is not None:
            lo = until - (SPANS[span] or 0.0)
        if since is not None:
            lo = max(lo, since)
        # Whole buckets only: one reaching back past `lo` is left out.
        units = [u for u in units if u.get("first_at", u["updated_at"]) > lo]
        if not units or until is None:
            return HistoryWindow([], span, asked or 10, since, until, bad_lines=self.bad_lines)
        ladder = [s for s in LADDER if asked is None or s >= asked] or [LADDER[-1]]
        if asked is not None and asked not in ladder:
            ladder.insert(0, asked)
        items: list[dict[str, Any]] = []
        step = ladder[0]
        for step in ladder:
            if asked is None and step != ladder[-1] and (until - _start(units[0])) / step > limit:
                continue  # far too many: skip the fold (never the coarsest: it is served)
            items = refold(units, lambda u, s=step: max(s, _tier(SERVED_TIERS,
                                                                  until - _start(u))))
            if len(items) <= limit:
                break
        more = len(items) > limit
        items = items[-limit:]
        return HistoryWindow([_served(i) for i in items], span, step,
                             None if lo == -math.inf else lo, until, more, self.bad_lines)

    def _units(self) -> list[dict[str, Any]]:
        """The copy's buckets up to where the raw samples of the last hour take over, split
        at a bucket's end in history.jsonl: each sample counts once."""
        if not self.recent:
            return list(self.records)
        cut_t = self.recent[-1].sample["updated_at"] - HOUR
        split = prev_end = 0
        for r in self.records:
            # A bucket whose samples `recent` does not all hold (it starts before
            # recent_from) stays a bucket.
            if r["bucket_start"] + r["bucket_s"] <= cut_t or prev_end < self.recent_from:
                split = r["src_end"]
            prev_end = r["src_end"]
        return [r for r in self.records if r["src_end"] <= split] + \
            [r.sample for r in self.recent if r.end > split]


def group_bucket(group: list[dict[str, Any]], minute: float) -> dict[str, Any]:
    """A minute of raw samples as one bucket of the copy (with the raw offset it reaches)."""
    return fold(group, minute, int(MINUTE))


def _served(item: dict[str, Any]) -> dict[str, Any]:
    if "bucket_s" in item and "src_end" not in item:
        return item
    out = {k: v for k, v in item.items() if k != "src_end"}
    if "bucket_s" not in out:  # a raw sample alone in its bucket
        out.update(bucket_s=10, bucket_start=math.floor(out["updated_at"] / 10) * 10,
                   samples=1, first_at=out["updated_at"])
    return out


_stores: dict[Path, HistoryStore] = {}
_stores_lock = threading.Lock()


def store_for(run_dir: Path) -> HistoryStore:
    """The process's store for a run directory (its cache kept between calls)."""
    key = Path(os.path.abspath(run_dir))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = HistoryStore(key)
        return store


def read_history(run_dir: Path, span: str = "1h", since: float | None = None,
                 resolution: int | None = None, limit: int = 1000) -> HistoryWindow:
    """The run's history for a span ("1h", "6h" or "all", counted back from the newest
    sample) after `since`, oldest first: 10 s buckets for the last hour, 1 min for the last
    day, 10 min before (1 h past 30 days), or `resolution` seconds where that is coarser; a
    window that would pass `limit` items is served coarser (`step_s` says how), and past the
    coarsest step only its newest `limit` (`more`). Blocking: call it from a thread."""
    store = store_for(run_dir)
    try:
        return store.window(span, since, resolution, limit)
    except RefusedFile as exc:
        return HistoryWindow([], span, resolution or SPAN_STEP.get(span) or 10, since, None,
                             refused=str(exc))
