"""`fleetdeck replay PULL_DIR/NODE` (or a run dir): a finished run's recorded history, read
back as the snapshots the TUI draws, with a time cursor (Dolphie's record and replay, for
post-mortems). There is no second recorder: the history is the one the engine keeps, read
through console/runhistory.py. This module is the data (headless); console/tui/replay.py
draws it."""

from __future__ import annotations

import argparse
import bisect
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.schema import Progress, ServerStatus, Snapshot
from console.fleet import Fleet, Node
from console.headless import EXIT_USAGE, say
from console.report.verb import runs_here
from console.runhistory import HistoryRead, read_dir
from console.sanitize import shown


class NoRecording(ValueError):
    """Nothing to replay here; the message says where and why."""


@dataclass(slots=True)
class Recording:
    """One run's samples in time order, and where the cursor stands."""

    node: str
    run_dir: Path
    samples: list[Progress] = field(default_factory=list)
    skipped: int = 0  # lines the reader or the schema refused
    cursor: int = 0

    @property
    def times(self) -> list[float]:
        return [p.updated_at for p in self.samples]

    @property
    def now(self) -> float:
        """The cursor's time: the replay's clock."""
        return self.samples[self.cursor].updated_at

    @property
    def start(self) -> float:
        return self.samples[0].updated_at

    @property
    def end(self) -> float:
        return self.samples[-1].updated_at

    def step(self, n: int) -> bool:
        """Move n samples (back when negative), stopping at either end; moved or not."""
        to = max(0, min(len(self.samples) - 1, self.cursor + n))
        moved = to != self.cursor
        self.cursor = to
        return moved

    def jump(self, t: float) -> None:
        """The cursor to the last sample at or before t (the first, before the start)."""
        self.cursor = max(0, bisect.bisect_right(self.times, t) - 1)

    def snapshot(self) -> Snapshot:
        """The sample under the cursor as the TUI's snapshot: the engine's progress and, from
        its per-server figures, the server rows (GPU figures and SGLang's own are not in the
        history: unknown)."""
        p = self.samples[self.cursor]
        servers = []
        for key, s in sorted(p.servers.items(), key=lambda kv: int(kv[0])):
            servers.append(ServerStatus(
                number=int(key), url=s.url, state=s.state, in_flight=s.in_flight,
                limit=s.limit, completed=s.completed, failed=s.failed, req_per_s=s.req_per_s,
                tok_per_s=s.tok_per_s, accept_length=s.accept_length,
                last_error=s.last_error))
        return Snapshot(kind="generate", run=p.run, run_dir=str(self.run_dir), host="replay",
                        status=p.status, updated_at=p.updated_at, source="supervisor",
                        progress=p, servers=servers)

    def history_before(self, window: int) -> list[Progress]:
        """The last `window` samples up to the cursor (the sparklines' past)."""
        return self.samples[max(0, self.cursor + 1 - window): self.cursor + 1]

    def fleet(self) -> Fleet:
        """A fleet of this one node, local, never connected."""
        return Fleet(nodes=[Node(name=self.node, run_dir=str(self.run_dir), local=True)],
                     source=f"replay of {self.run_dir}")


def load(path: Path) -> Recording:
    """The run dir at path (or the one run a node's pull folder holds) and its history."""
    found = runs_here(path) if path.is_dir() else []
    if not found:
        raise NoRecording(f"{path}: no run directory with a history.jsonl here (give a pulled "
                          "run, PULL_DIR/NODE/RUN, or its node's folder PULL_DIR/NODE)")
    if len(found) > 1:
        names = ", ".join(name for name, _ in found[:8])
        raise NoRecording(f"{path}: holds {len(found)} runs ({names}); give one of them")
    name, run_dir = found[0]
    node = name.split("/")[0] if "/" in name else run_dir.parent.name or name
    info = HistoryRead()
    rec = Recording(node, run_dir)
    by_time: dict[float, Progress] = {}
    for page in read_dir(run_dir, info):
        for item in page:
            try:
                p = msgspec.convert(item, Progress)
            except msgspec.ValidationError:
                rec.skipped += 1
                continue
            # ASCII digits only: "²".isdigit() holds, and int("²") raises.
            if all(k.isascii() and k.isdigit() for k in p.servers):
                by_time[p.updated_at] = p
            else:
                rec.skipped += 1
    rec.skipped += info.bad_lines
    if info.refused:
        raise NoRecording(f"{run_dir}: history not read: {info.refused}")
    rec.samples = [by_time[t] for t in sorted(by_time)]
    if not rec.samples:
        raise NoRecording(f"{run_dir}/history.jsonl: no sample to replay (a generation run's "
                          "history; a training run keeps none)")
    return rec


_OFFSET = re.compile(r"\+(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")


def parse_time(text: str, start: float, end: float) -> float:
    """A time to jump to: `start`, `end`, `+1h30m` / `+90m` / `+45s` from the start, a UTC
    clock time `HH:MM[:SS]` (its first moment at or after the start), or `YYYY-MM-DD
    HH:MM[:SS]` (UTC). ValueError names the forms."""
    text = text.strip()
    if text in ("start", "end"):
        return start if text == "start" else end
    m = _OFFSET.fullmatch(text)
    if m and any(m.groups()):
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        return start + h * 3600 + mi * 60 + s
    m = _CLOCK.fullmatch(text)
    if m:
        hh, mm, ss = int(m[1]), int(m[2]), int(m[3] or 0)
        if hh < 24 and mm < 60 and ss < 60:
            day = datetime.fromtimestamp(start, UTC).replace(hour=hh, minute=mm, second=ss,
                                                             microsecond=0).timestamp()
            return day if day >= start - 1 else day + 86400
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a time: give start, end, +1h30m (from the start), "
                     "HH:MM[:SS] or YYYY-MM-DD HH:MM[:SS] (UTC)")


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def add(sub: Any) -> None:
    p = sub.add_parser(
        "replay", help="the TUI on a finished run's recorded history, with a time cursor "
        "(step, play, jump): for post-mortems")
    p.add_argument("path", metavar="PULL_DIR/NODE|RUN_DIR")
    p.add_argument("--at", default=None, metavar="TIME",
                   help="start at this time (as the jump key takes it; default: the start)")
    p.set_defaults(runner=cmd_replay, sync=True)


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        rec = load(Path(args.path))
        if args.at is not None:
            rec.jump(parse_time(args.at, rec.start, rec.end))
    except (NoRecording, ValueError) as exc:
        say(f"fleetdeck replay: {shown(exc)}")
        return EXIT_USAGE
    from console.tui.replay import run_replay  # the door into Textual, as `fleetdeck` is

    return run_replay(rec)
