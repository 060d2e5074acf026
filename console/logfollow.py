"""A node's log as the console follows it: the lines kept (bounded), each one's level, and
where the next `logs` call reads on from. Headless and TUI alike; nothing a node sends is
trusted (a malformed answer is refused by name, an overlong line cut).

The `logs` RPC answers a tail first (`next_from`, `inode`), then, given `from` and `inode`,
only what the file gained; a rotated, truncated or rewritten file restarts from its tail
(`restarted`), and a gain too large to send is passed over (`skipped_bytes`). A line still
being written comes last, `unfinished`, and comes again whole in the next answer; a line
longer than one answer carries is read on from its middle (`mid_line`, sent back as given).
An agent from before following answers a tail only (no `next_from`): shown, not followed."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_LINES = 10_000  # kept per log; the oldest go first
MAX_LINE_CHARS = 4_000  # a longer line is cut (a node may send a 4 MiB one)
FOLLOW_LINES = 5_000  # asked for per follow call (the agent's most)
OLD_AGENT_NOTE = "this agent cannot follow logs: fleetdeck bootstrap NODE upgrades it"

# Levels, ranked. MARK: the console's own note in the log (rotated, skipped): always shown.
DEBUG, INFO, WARNING, ERROR, MARK = 0, 1, 2, 3, 9
LEVEL_NAMES = {DEBUG: "debug", INFO: "info", WARNING: "warning", ERROR: "error"}
# The level filter's steps: everything, warnings and worse, errors only.
FILTERS: tuple[tuple[int, str], ...] = ((DEBUG, "all"), (WARNING, "warning+"), (ERROR, "error+"))

_WORDS = {"DEBUG": DEBUG, "TRACE": DEBUG, "INFO": INFO, "NOTICE": INFO, "WARNING": WARNING,
          "WARN": WARNING, "ERROR": ERROR, "EXCEPTION": ERROR, "CRITICAL": ERROR,
          "FATAL": ERROR}
# A level word where logging formats put it: first (`WARNING:root:`, uvicorn's `ERROR:    `),
# or after a timestamp, a bracketed prefix (SGLang's `[2026-01-02 10:00:00 TP0]`) and at most
# one logger name (`2026-01-02 10:00:00,123 trainer.cli INFO msg`).
_LEVEL = re.compile(
    r"\s{0,4}(?:\[[^\]]{0,80}\]\s*)?(?:\d[\d:,./T-]*(?:[ T][\d:,.]+)?(?:Z|[+-]\d\d:?\d\d)?\s+)?"
    r"(?:\[[^\]]{0,80}\]\s*)?(?:[A-Za-z_][\w.-]{0,60}:?\s+)?\[?"
    r"(DEBUG|TRACE|INFO|NOTICE|WARNING|WARN|ERROR|EXCEPTION|CRITICAL|FATAL)\b\]?")
# A new record without a level word: a timestamp or a bracketed timestamp first (SGLang logs
# its warnings this way too; counted as info: nothing in the line says otherwise).
_RECORD = re.compile(r"(?:\[\s*)?\d{4}-\d\d-\d\d[ T]\d\d:\d\d")
# Python's own error and warning lines: a traceback's start (anywhere: SGLang logs `Scheduler
# hit an exception: Traceback ...`) and its last line, warnings.warn's.
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)(?::|$)")
_PY_WARNING = re.compile(r"\S.*:\d+: [A-Za-z_]\w*Warning: ")


def line_level(line: str, previous: int) -> int:
    """The level of one log line: its level word (Python logging's, uvicorn's, SGLang's), a
    traceback or an exception line (error), a Python warning (warning); a line with none of
    these inherits the previous line's level, so a traceback's frames stay with its error,
    unless it starts a new timestamped record (info)."""
    head = line[:200]
    m = _LEVEL.match(head)
    if m is not None:
        return _WORDS[m.group(1)]
    if _TRACEBACK.search(line) or _EXCEPTION.match(head):
        return ERROR
    if _PY_WARNING.match(head):
        return WARNING
    if _RECORD.match(head):
        return INFO
    return previous if previous != MARK else INFO


class BadLogAnswer(ValueError):
    """An answer to `logs` that is not what the protocol says (named, never guessed at)."""


@dataclass(slots=True)
class Gained:
    """What one answer added: the finished lines (for a printer that cannot take a line
    back), the unfinished last one, and the console's note (rotated, skipped)."""

    lines: list[str]
    unfinished: str | None = None
    note: str | None = None


def _field(reply: dict[str, Any], key: str, kind: type, optional: bool = False) -> Any:
    value = reply.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadLogAnswer(f"the answer's {key} is {value!r}, not {kind.__name__}")
    if isinstance(value, int) and value < 0:
        raise BadLogAnswer(f"the answer's {key} is {value}, below 0")
    return value


@dataclass(slots=True)
class FollowedLog:
    """One log of one node, as followed. `seq` numbers lines from the first ever kept, so a
    viewer can say "from line N on" however many were dropped since."""

    name: str
    max_lines: int = MAX_LINES
    path: str = ""
    lines: deque[str] = field(default_factory=deque)
    levels: deque[int] = field(default_factory=deque)
    dropped: int = 0  # lines dropped from the front: the seq of lines[0]
    rewrites: int = 0  # bumped when a kept line changed (an unfinished one replaced)
    next_from: int | None = None
    inode: int | None = None
    unfinished: bool = False  # the last line kept is being written: the next answer redoes it
    mid_line: bool = False  # next_from is inside an over-long line (the agent said so)
    old_agent: bool = False  # the agent answers tails only: never followed

    @property
    def end(self) -> int:
        """The seq after the last line kept."""
        return self.dropped + len(self.lines)

    def params(self, tail_lines: int) -> dict[str, Any]:
        """The next `logs` call: a tail of `tail_lines` first, then only what is new."""
        if self.next_from is None:
            return {"name": self.name, "n": tail_lines}
        out: dict[str, Any] = {"name": self.name, "n": FOLLOW_LINES, "from": self.next_from}
        if self.inode is not None:
            out["inode"] = self.inode
        if self.mid_line:
            out["mid_line"] = True
        return out

    def apply(self, reply: Any) -> Gained | None:
        """Take one answer to `params()`. None: a stale answer (it read from another offset
        than the one kept now: another call got there first), left alone. BadLogAnswer: an
        answer that is not the protocol's, nothing taken."""
        if not isinstance(reply, dict):
            raise BadLogAnswer(f"the answer is {type(reply).__name__}, not an object")
        raw = reply.get("lines")
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise BadLogAnswer("the answer's lines are not a list of text")
        next_from = _field(reply, "next_from", int, optional=True)
        if next_from is None:
            return self._old_tail(raw)
        inode = _field(reply, "inode", int, optional=True)
        asked = _field(reply, "from", int, optional=True)
        skipped = _field(reply, "skipped_bytes", int, optional=True) or 0
        restarted = reply.get("restarted")
        if restarted not in (None, "rotated", "truncated", "rewritten"):
            raise BadLogAnswer(f"the answer's restarted is {restarted!r}")
        unfinished = reply.get("unfinished") is True
        if asked != self.next_from:
            return None
        note = None
        if restarted is not None:
            note = f"the log was {restarted}; shown again from its tail"
        elif skipped:
            note = f"{skipped:,} bytes passed over: more came than one answer carries"
        texts = [_cut(x) for x in raw]
        kept = texts
        if self.unfinished and self.lines:
            if texts and texts[0] == self.lines[-1]:
                kept = texts[1:]  # the same line again (whole now, or still unfinished)
            else:
                self.lines.pop()  # it grew: the kept one is replaced
                self.levels.pop()
                self.rewrites += 1
        if isinstance(reply.get("path"), str):
            self.path = reply["path"]
        self.next_from, self.inode, self.unfinished = next_from, inode, unfinished and bool(raw)
        self.mid_line = reply.get("mid_line") is True
        if note is not None:
            self._keep(f"-- fleetdeck: {note} --", MARK)
        for text in kept:
            self._keep(text, line_level(text, self.levels[-1] if self.levels else INFO))
        if self.unfinished:
            return Gained(texts[:-1], texts[-1], note)
        return Gained(texts, None, note)

    def _old_tail(self, raw: list[str]) -> Gained:
        """A tail from an agent older than following (no `next_from`): the lines kept in
        place of any kept before (each such answer is the whole tail again), said once."""
        if self.next_from is not None:
            raise BadLogAnswer("the answer has no next_from, though an earlier one had")
        note = None if self.old_agent else OLD_AGENT_NOTE
        self.old_agent = True
        self.dropped += len(self.lines)
        self.lines.clear()
        self.levels.clear()
        self.rewrites += 1
        texts = [_cut(x) for x in raw]
        for text in texts:
            self._keep(text, line_level(text, self.levels[-1] if self.levels else INFO))
        self._keep(f"-- fleetdeck: {OLD_AGENT_NOTE} --", MARK)  # in the pane: why it stands
        return Gained(texts, None, note)

    def _keep(self, text: str, level: int) -> None:
        self.lines.append(text)
        self.levels.append(level)
        if len(self.lines) > self.max_lines:
            self.lines.popleft()
            self.levels.popleft()
            self.dropped += 1


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]}... ({len(line) - MAX_LINE_CHARS:,} more characters)"
