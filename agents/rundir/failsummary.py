"""failures.jsonl grouped by error class for people (the `failures` RPC): counts, first and
last time, the servers named and example lines of each class of `failed` and `requeued`.

The journal of a long run can hold millions of lines, so it is read incrementally: a
summarizer keeps its running summary and the offset it has read to, and each call reads only
what was appended since, at most MAX_READ_BYTES (a call that did not reach the end says so:
`complete` false; the next call reads on). Nothing here runs in the engine: the journal's
writer never waits for it, and its reader runs in a thread of whoever answers the RPC.
"""

from __future__ import annotations

import math
import os
import stat
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from agents.rundir.schema import (
    MAX_EXAMPLE_CHARS,
    MAX_FAILURE_GROUPS,
    MAX_GROUP_SERVERS,
    FailureExample,
    FailureGroup,
    FailureSummary,
    ServerCount,
    failure_decoder,
)

FILE = "failures.jsonl"
MAX_READ_BYTES = 8 * 1024 * 1024  # one call: ~35k lines, ~65 ms of CPU in a thread
MAX_SERVERS_KEPT = 256  # distinct servers counted per class; more are counted together
MAX_CLASS_CHARS = 64
RECENT_EXAMPLES = 2  # beside the first
Event = Literal["failed", "requeued"]


@dataclass(slots=True)
class _Group:
    count: int = 0
    first: float = math.inf
    last: float = 0.0
    servers: dict[int, int] = field(default_factory=dict)
    servers_more: int = 0
    no_server: int = 0
    first_example: FailureExample | None = None
    recent: deque[FailureExample] = field(default_factory=lambda: deque(maxlen=RECENT_EXAMPLES))


def _when(t: float) -> float:
    """An event's time as the answer may carry it (a hostile file may hold anything)."""
    if not math.isfinite(t):
        return 0.0
    return min(max(t, 0.0), 1e11)


class FailureSummarizer:
    """The running summary of one run's failures.jsonl. Thread-safe; `summary()` blocks on
    the disk (call it off the event loop)."""

    def __init__(self, run_dir: Path, max_read_bytes: int = MAX_READ_BYTES) -> None:
        self.path = run_dir / FILE
        self.max_read_bytes = max_read_bytes
        self._lock = threading.Lock()
        self._reset(None)

    def _reset(self, ident: tuple[int, int] | None) -> None:
        self._ident = ident  # (st_dev, st_ino): a replaced file (resume-from-s3) starts over
        self._offset = 0
        self._skipping = False  # inside a line longer than one read: skipped to its end
        self._lines = 0
        self._groups: dict[tuple[Event, str], _Group] = {}
        self._events = 0
        self._retries = 0
        self._other = 0
        self._unreadable = 0

    def summary(self) -> FailureSummary:
        with self._lock:
            total, at_end = self._read_on()
            return self._answer(total, at_end)

    def _read_on(self) -> tuple[int, bool]:
        """Read what was appended since the last call (at most max_read_bytes): the file's
        size, and whether this read reached its end (all but an unfinished last line, which
        is read once its newline is there). A symlink or anything but a regular file is never
        read."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._reset(None)
            return 0, True
        except OSError as exc:
            raise OSError(exc.errno, f"{self.path}: {exc.strerror}; not read") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{self.path}: not a regular file; not read")
            ident = (st.st_dev, st.st_ino)
            if ident != self._ident or st.st_size < self._offset:
                self._reset(ident)
            want = min(st.st_size - self._offset, self.max_read_bytes)
            if want <= 0:
                return st.st_size, True
            data = os.pread(fd, want, self._offset)
        finally:
            os.close(fd)
        at_end = self._offset + len(data) >= st.st_size
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) == self.max_read_bytes:  # one line longer than a whole read
                if not self._skipping:
                    self._lines += 1
                    self._unreadable += 1
                self._skipping = True
                self._offset += len(data)
            return st.st_size, at_end  # else a line still being written: read once it ends
        self._take(data[:end + 1])
        self._offset += end + 1
        return st.st_size, at_end

    def _take(self, data: bytes) -> None:
        lines = data.split(b"\n")
        lines.pop()  # after the last newline: nothing
        if self._skipping:
            lines.pop(0)  # the end of the over-long line, counted when it began
            self._skipping = False
        for raw in lines:
            self._lines += 1
            if not raw.strip():
                continue
            try:
                ev = failure_decoder.decode(raw)
            except msgspec.DecodeError:
                self._unreadable += 1
                continue
            if ev.event == "retry":
                self._retries += 1
                continue
            self._events += 1
            event: Event = "failed" if ev.event == "failed" else "requeued"
            cls = (ev.error if event == "failed" else ev.what) or "unknown"
            key = (event, cls[:MAX_CLASS_CHARS])
            group = self._groups.get(key)
            if group is None:
                if len(self._groups) >= MAX_FAILURE_GROUPS:
                    self._other += 1
                    continue
                group = self._groups[key] = _Group()
            when = _when(ev.time)
            group.count += 1
            group.first = min(group.first, when)
            group.last = max(group.last, when)
            server = ev.server
            if server is None or not 0 <= server <= 2**31:
                group.no_server += 1
            elif server in group.servers or len(group.servers) < MAX_SERVERS_KEPT:
                group.servers[server] = group.servers.get(server, 0) + 1
            else:
                group.servers_more += 1
            example = FailureExample(self._lines, raw[:MAX_EXAMPLE_CHARS].decode(
                "utf-8", errors="replace")[:MAX_EXAMPLE_CHARS])
            if group.first_example is None:
                group.first_example = example
            else:
                group.recent.append(example)

    def _answer(self, total: int, at_end: bool) -> FailureSummary:
        groups = []
        for (event, cls), g in sorted(self._groups.items(), key=lambda kv: -kv[1].count):
            ranked = sorted(g.servers.items(), key=lambda sc: (-sc[1], sc[0]))
            shown = ranked[:MAX_GROUP_SERVERS]
            examples = [e for e in (g.first_example, *g.recent) if e is not None]
            groups.append(FailureGroup(
                event=event, error=cls, count=g.count, first=g.first, last=g.last,
                servers=[ServerCount(s, c) for s, c in shown],
                servers_more=g.servers_more + sum(c for _, c in ranked[MAX_GROUP_SERVERS:]),
                no_server=g.no_server, examples=examples))
        return FailureSummary(
            groups=groups, events=self._events, retries=self._retries, other=self._other,
            unreadable=self._unreadable, bytes_read=self._offset, bytes_total=total,
            complete=at_end, lines=self._lines)


__all__ = ["FILE", "MAX_READ_BYTES", "FailureSummarizer"]
