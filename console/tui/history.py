"""A node's past for the sparklines: throughput, accept length and failures over a span (the
last hour, 6 hours or the whole run, `h` cycles), one point per step (10 s for the hour, as
the node's history store serves the others), the newest point updated live from each
snapshot. Plain data: the widgets draw it, the app fills it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from agents.rundir.schema import Progress

STEP_S = 10.0
MAX_POINTS = 360  # an hour at the agent's 10 s sampling; the most any span is fetched with
SPANS = ("1h", "6h", "all")  # the `history` RPC's spans, in the order `h` cycles them
SPAN_TITLES = {"1h": "last hour", "6h": "last 6 h", "all": "whole run"}


@dataclass(slots=True)
class Point:
    t: float
    tok_per_s: float
    req_per_s: float
    accept_length: float | None
    failed: int


def _mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def point_from_dict(item: dict[str, Any]) -> Point | None:
    """A point from a history item (a progress.json dict as the agent recorded it)."""
    t = item.get("updated_at")
    if not isinstance(t, (int, float)):
        return None
    servers = item.get("servers") or {}
    srv = list(servers.values()) if isinstance(servers, dict) else []
    return Point(
        t=float(t),
        tok_per_s=float(sum(s.get("tok_per_s") or 0.0 for s in srv)),
        req_per_s=float(item.get("rate_per_sec") or 0.0),
        accept_length=_mean(s.get("accept_length") for s in srv),
        failed=int(item.get("failed") or 0),
    )


def point_from_progress(p: Progress) -> Point:
    srv = list(p.servers.values())
    return Point(t=p.updated_at, tok_per_s=sum(s.tok_per_s for s in srv),
                 req_per_s=p.rate_per_sec, accept_length=_mean(s.accept_length for s in srv),
                 failed=p.failed)


class NodeHistory:
    def __init__(self, step_s: float = STEP_S, max_points: int = MAX_POINTS) -> None:
        self.step_s = step_s
        self.points: deque[Point] = deque(maxlen=max_points)
        self.loaded = False  # the `history` RPC has answered
        self.version = 0
        self.span = SPANS[0]

    def cycle_span(self) -> str:
        """The next span; its points are fetched again (the old ones are dropped)."""
        self.span = SPANS[(SPANS.index(self.span) + 1) % len(SPANS)]
        self.points.clear()
        self.loaded = False
        self.version += 1
        return self.span

    @property
    def newest(self) -> float:
        return self.points[-1].t if self.points else 0.0

    def add(self, point: Point) -> None:
        """Extend with a live point: it replaces the newest one until a step has passed."""
        if self.points and point.t <= self.points[-1].t:
            return
        if len(self.points) >= 2 and self.points[-1].t - self.points[-2].t < self.step_s:
            self.points[-1] = point  # the tip moves until it is a step past the one before
        else:
            self.points.append(point)
        self.version += 1

    def add_progress(self, progress: Progress) -> None:
        self.add(point_from_progress(progress))

    def load(self, items: Iterable[dict[str, Any]], step_s: float | None = None) -> None:
        """Merge fetched history (oldest first) under the live points already held; `step_s`:
        the step it was served at, which live points then keep."""
        if step_s is not None and step_s > 0:
            self.step_s = float(step_s)
        fetched = [p for p in (point_from_dict(i) for i in items) if p is not None]
        fetched.sort(key=lambda p: p.t)
        if fetched:
            last = fetched[-1].t
            live = [p for p in self.points if p.t > last]
            self.points.clear()
            self.points.extend(fetched + live)
        self.loaded = True
        self.version += 1

    # -- series for the sparklines ----------------------------------------------------------

    def throughput(self) -> list[float]:
        return [p.tok_per_s for p in self.points]

    def accept_length(self) -> list[float]:
        return [p.accept_length for p in self.points if p.accept_length is not None]

    def failures(self) -> list[float]:
        """New failures per step (the totals' differences; a reset counts as zero)."""
        pts = list(self.points)
        return [float(max(0, b.failed - a.failed)) for a, b in pairwise(pts)]
