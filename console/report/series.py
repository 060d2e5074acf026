"""A run's history as the report's figures: each recorded sample (a progress.json as the
engine wrote it) cut to what the plots need, checked (a node's file is trusted no further
than its types), thinned to a drawable number of points, and summed up for the table.
Plain data: no plotting here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

import msgspec

# Points per plotted series: above this the samples are thinned evenly (first and last
# kept). Counters are plotted as differences between kept samples, so nothing is lost.
MAX_POINTS = 2000


class ServerSample(msgspec.Struct):
    tok_per_s: float = 0.0
    in_flight: int = 0
    limit: int = 0
    accept_length: float | None = None


class CostSample(msgspec.Struct):
    usd: float = 0.0


class Sample(msgspec.Struct):
    """One history line, only the fields the report draws; any other field is ignored and a
    missing one is unknown (None) or zero."""

    updated_at: float
    status: str = ""
    run: str = ""
    total: int = 0
    completed: int = 0
    failed: int = 0
    truncated: int = 0
    truncated_loops: int = 0
    in_flight: int = 0
    concurrency: int = 0
    rate_per_sec: float = 0.0
    total_output_tokens: int = 0
    eta_hours: float | None = None
    eta_p10_hours: float | None = None
    eta_p90_hours: float | None = None
    elapsed_hours: float = 0.0
    gpus: int = 0
    gpu_hours: float = 0.0
    cost: CostSample | None = None
    s3_pending: int = 0
    servers: dict[str, ServerSample] = msgspec.field(default_factory=dict)

    @property
    def tok_per_s(self) -> float:
        return sum(s.tok_per_s for s in self.servers.values())

    @property
    def left(self) -> int:
        return max(0, self.total - self.completed - self.failed)


def decode(items: Iterable[dict[str, object]]) -> tuple[list[Sample], int]:
    """The samples that fit, oldest first, and how many items did not."""
    out: list[Sample] = []
    bad = 0
    for item in items:
        try:
            out.append(msgspec.convert(item, Sample))
        except msgspec.ValidationError:
            bad += 1
    return out, bad


@dataclass(slots=True)
class RunHistory:
    """One node's run: its name in the report, and its samples in time order."""

    name: str
    samples: list[Sample] = field(default_factory=list)
    bad: int = 0  # lines or items skipped as unreadable
    note: str | None = None  # e.g. the node's refusal, or that the history was cut

    def add(self, items: Iterable[dict[str, object]]) -> None:
        got, bad = decode(items)
        self.samples.extend(got)
        self.bad += bad

    def finish(self) -> None:
        """Time order, one sample per time (a page boundary or a resumed engine may repeat)."""
        by_time = {s.updated_at: s for s in self.samples}
        self.samples = [by_time[t] for t in sorted(by_time)]

    @property
    def run(self) -> str:
        return next((s.run for s in reversed(self.samples) if s.run), "")

    def servers(self) -> list[str]:
        """Server numbers seen anywhere in the run, in number order."""
        seen = {k for s in self.samples for k in s.servers}
        def number(k: str) -> bool:  # ASCII only: "²".isdigit() holds, and int() refuses it
            return k.isascii() and k.isdigit()
        return sorted(seen, key=lambda k: (not number(k), int(k) if number(k) else 0, k))


def thin(samples: list[Sample], max_points: int = MAX_POINTS) -> list[Sample]:
    if len(samples) <= max_points:
        return samples
    step = (len(samples) - 1) / (max_points - 1)
    return [samples[round(i * step)] for i in range(max_points)]


def per_step(samples: list[Sample], counter: str) -> list[float]:
    """A counter's growth between consecutive samples (a counter that went down, a resumed
    or re-counted run, counts as no growth); one value per sample after the first."""
    return [float(max(0, getattr(b, counter) - getattr(a, counter)))
            for a, b in pairwise(samples)]


def truncation_share(samples: list[Sample]) -> list[float | None]:
    """Per step: answers cut at max_tokens / answers written (None where none were)."""
    out: list[float | None] = []
    for a, b in pairwise(samples):
        done = b.completed - a.completed
        cut = max(0, b.truncated - a.truncated)
        out.append(min(1.0, cut / done) if done > 0 else None)
    return out


@dataclass(slots=True)
class Summary:
    """One row of the summary table."""

    name: str
    run: str
    status: str
    started_at: float | None
    ended_at: float | None
    hours: float
    total: int
    completed: int
    failed: int
    truncated: int
    truncated_loops: int
    output_tokens: int
    mean_tok_per_s: float | None
    peak_tok_per_s: float | None
    mean_accept_length: float | None
    gpus: int
    gpu_hours: float
    cost_usd: float | None
    eta_hours: float | None
    samples: int
    bad: int

    @property
    def truncated_share(self) -> float | None:
        return self.truncated / self.completed if self.completed else None


def summary(h: RunHistory) -> Summary:
    s = h.samples
    last = s[-1] if s else None
    hours = (s[-1].updated_at - s[0].updated_at) / 3600 if len(s) > 1 else 0.0
    rates = [x.tok_per_s for x in s]
    accepts = [a for x in s for a in (v.accept_length for v in x.servers.values())
               if a is not None]
    elapsed = last.elapsed_hours if last is not None else 0.0
    mean = (last.total_output_tokens / (elapsed * 3600)
            if last is not None and elapsed > 0 else None)
    return Summary(
        name=h.name, run=h.run, status=last.status if last else "no history",
        started_at=s[0].updated_at if s else None, ended_at=last.updated_at if last else None,
        hours=hours, total=last.total if last else 0, completed=last.completed if last else 0,
        failed=last.failed if last else 0, truncated=last.truncated if last else 0,
        truncated_loops=last.truncated_loops if last else 0,
        output_tokens=last.total_output_tokens if last else 0, mean_tok_per_s=mean,
        peak_tok_per_s=max(rates) if rates else None,
        mean_accept_length=sum(accepts) / len(accepts) if accepts else None,
        gpus=last.gpus if last else 0, gpu_hours=last.gpu_hours if last else 0.0,
        cost_usd=last.cost.usd if last is not None and last.cost is not None else None,
        eta_hours=last.eta_hours if last else None, samples=len(s), bad=h.bad)


def total(rows: list[Summary], name: str) -> Summary:
    """A campaign's row: the nodes' rows added up (times: the earliest start, latest end)."""
    starts = [r.started_at for r in rows if r.started_at is not None]
    ends = [r.ended_at for r in rows if r.ended_at is not None]
    peaks = [r.peak_tok_per_s for r in rows if r.peak_tok_per_s is not None]
    means = [r.mean_tok_per_s for r in rows if r.mean_tok_per_s is not None]
    accepts = [r.mean_accept_length for r in rows if r.mean_accept_length is not None]
    costs = [r.cost_usd for r in rows if r.cost_usd is not None]
    etas = [r.eta_hours for r in rows if r.eta_hours is not None]
    return Summary(
        name=name, run="", status=", ".join(sorted({r.status for r in rows})),
        started_at=min(starts) if starts else None, ended_at=max(ends) if ends else None,
        hours=(max(ends) - min(starts)) / 3600 if starts and ends else 0.0,
        total=sum(r.total for r in rows), completed=sum(r.completed for r in rows),
        failed=sum(r.failed for r in rows), truncated=sum(r.truncated for r in rows),
        truncated_loops=sum(r.truncated_loops for r in rows),
        output_tokens=sum(r.output_tokens for r in rows),
        mean_tok_per_s=sum(means) if means else None,
        peak_tok_per_s=sum(peaks) if peaks else None,
        mean_accept_length=sum(accepts) / len(accepts) if accepts else None,
        gpus=sum(r.gpus for r in rows), gpu_hours=sum(r.gpu_hours for r in rows),
        cost_usd=sum(costs) if costs else None, eta_hours=max(etas) if etas else None,
        samples=sum(r.samples for r in rows), bad=sum(r.bad for r in rows))
