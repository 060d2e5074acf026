"""The report drawn: each plot once with matplotlib's Agg canvas (no display, no pyplot's
global state), kept as SVG for the page and as PNG for the dataset card, and one HTML page
that holds everything inline (no script, no font, no request: it opens anywhere, offline).
Every string from a node is escaped for HTML, and for matplotlib's mathtext in plot text."""

from __future__ import annotations

import html
import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from agents.rundir.atomic import atomic_write, make_dirs
from console.report.series import (
    RunHistory,
    Summary,
    per_step,
    summary,
    thin,
    total,
    truncation_share,
)


class NoMatplotlib(RuntimeError):
    """matplotlib is not installed: it comes with the `report` extra."""


@dataclass(slots=True)
class Plot:
    name: str  # file stem: plots/NAME.png, and the figure's id on the page
    title: str
    caption: str
    svg: str
    png: bytes


def _text(s: str) -> str:
    """A node's string as matplotlib text: `$` would start mathtext, a leading `_` hides a
    legend entry."""
    s = s.replace("\\", "\\\\").replace("$", r"\$")
    return " " + s if s.startswith("_") else s


@dataclass(frozen=True, slots=True)
class TimeAxis:
    """Time since the report's first sample, in a unit chosen by its span."""

    t0: float
    scale: float  # seconds per unit
    unit: str

    @classmethod
    def spanning(cls, t0: float, end: float) -> TimeAxis:
        span = end - t0
        scale, unit = (1.0, "seconds") if span < 120 else \
            (60.0, "minutes") if span < 2 * 3600 else (3600.0, "hours")
        return cls(t0, scale, unit)


def _times(h: RunHistory, t: TimeAxis) -> list[float]:
    return [(s.updated_at - t.t0) / t.scale for s in thin(h.samples)]


Draw = Callable[[Any, list[RunHistory], TimeAxis], None]


def _label(h: RunHistory, runs: list[RunHistory], what: str = "") -> str:
    base = h.name if len(runs) > 1 else (what or h.name)
    if len(runs) > 1 and what:
        base = f"{h.name} {what}"
    return _text(base)


def _throughput(ax: Any, runs: list[RunHistory], t: TimeAxis) -> None:
    for h in runs:
        pts = thin(h.samples)
        ax.plot(_times(h, t), [s.tok_per_s for s in pts], label=_label(h, runs, "tok/s"))
    ax.set_ylabel("output tokens/s")


def _per_gpu(ax: Any, runs: list[RunHistory], t: TimeAxis) -> None:
    for h in runs:
        pts = thin(h.samples)
        for srv in h.servers():
            ys = [s.servers[srv].tok_per_s if srv in s.servers else float("nan") for s in pts]
            ax.plot(_times(h, t), ys, linewidth=1,
                    label=_text(f"{h.name} server {srv}" if len(runs) > 1 else f"server {srv}"))
    ax.set_ylabel("tokens/s per server")


def _accept(ax: Any, runs: list[RunHistory], t: TimeAxis) -> None:
    for h in runs:
        pts = thin(h.samples)
        for srv in h.servers():
            ys = [v if (v := s.servers[srv].accept_length if srv in s.servers else None)
                  is not None else float("nan") for s in pts]
            ax.plot(_times(h, t), ys, linewidth=1,
                    label=_text(f"{h.name} server {srv}" if len(runs) > 1 else f"server {srv}"))
    ax.set_ylabel("accept length (tokens)")


def _in_flight(ax: Any, runs: list[RunHistory], t: TimeAxis) -> None:
    right = ax.twinx()
    for h in runs:
        pts, xs = thin(h.samples), _times(h, t)
        line = ax.plot(xs, [s.in_flight for s in pts], label=_label(h, runs, "in flight"))[0]
        ax.plot(xs, [sum(v.limit for v in s.servers.values()) or s.concurrency for s in pts],
                linestyle="--", linewidth=1,
                color=line.get_color(), label=_label(h, runs, "concurrency limit"))
        right.plot(xs, [s.left for s in pts], linestyle=":", color=line.get_color(),
                   label=_label(h, runs, "queue: prompts left"))
    ax.set_ylabel("requests in flight")
    _twin_legend(ax, right, "prompts left", "upper right")


def _twin_legend(ax: Any, right: Any, right_label: str, where: str) -> None:
    """The right-hand axis labelled from 0, and one legend for both axes' lines."""
    right.set_ylabel(right_label)
    right.set_ylim(bottom=0)
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, loc=where, fontsize="small")


def _truncation(ax: Any, runs: list[RunHistory], t: TimeAxis) -> None:
    for h in runs:
        pts, xs = thin(h.samples), _times(h, t)
        share = truncation_share(pts)
        line = ax.plot(xs[1:], [100 * v if v is not None else float("nan") for v in share],
                       label=_label(h, runs, "per step"))[0]
        ax.plot(xs, [100 * s.truncated / s.completed if s.completed else float("nan")
                     for s in pts], linestyle="--", color=line.get_color(),
                label=_label(h, runs, "whole run"))
    ax.set_ylabel("answers cut at max_tokens (%)")
    ax.set_ylim(bottom=0)


def _failures(ax: Any, runs: list[RunHistory], t: TimeAxis) -> None:
    right = ax.twinx()
    for h in runs:
        pts, xs = thin(h.samples), _times(h, t)
        widths = [b - a for a, b in pairwise(xs)]
        bars = ax.bar(xs[1:], per_step(pts, "failed"), width=[-w for w in widths],
                      align="edge", alpha=0.6, label=_label(h, runs, "failed per step"))
        right.plot(xs, [s.failed for s in pts], color=bars.patches[0].get_facecolor()
                   if bars.patches else None, label=_label(h, runs, "failed, whole run"))
    ax.set_ylabel("failed per step")
    _twin_legend(ax, right, "failed, whole run", "upper left")


def _eta(ax: Any, runs: list[RunHistory], t: TimeAxis) -> None:
    for h in runs:
        pts, xs = thin(h.samples), _times(h, t)

        def fig(v: float | None) -> float:
            return float("nan") if v is None else v

        line = ax.plot(xs, [fig(s.eta_hours) for s in pts], label=_label(h, runs, "ETA"))[0]
        ax.fill_between(xs, [fig(s.eta_p10_hours) for s in pts],
                        [fig(s.eta_p90_hours) for s in pts], color=line.get_color(),
                        alpha=0.25, linewidth=0, label=_label(h, runs, "p10-p90 band"))
    ax.set_ylabel("hours left")
    ax.set_ylim(bottom=0)


PLOTS: tuple[tuple[str, str, str, Draw], ...] = (
    ("throughput", "Throughput", "Output tokens per second, all servers together (the "
     "engine's 30 s rates).", _throughput),
    ("per_gpu", "Tokens/s per GPU", "Each server's output tokens per second (a server spans "
     "its GPU group).", _per_gpu),
    ("accept_length", "Accept length", "Tokens accepted per speculative step, per server "
     "(none without speculative decoding).", _accept),
    ("in_flight", "In flight and queue", "Requests in flight and the concurrency limit "
     "(all servers' limits; left axis); the queue of prompts still to do (right axis, "
     "dotted).", _in_flight),
    ("truncation", "Truncation share", "Share of answers cut at max_tokens: per step "
     "between samples, and over the whole run so far (dashed).", _truncation),
    ("failures", "Failures", "Prompts given up per step (bars) and in all (line).",
     _failures),
    ("eta", "ETA band", "Hours left as the engine estimated them, with its p10-p90 band.",
     _eta),
)


def draw(runs: list[RunHistory]) -> list[Plot]:
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise NoMatplotlib("the report draws with matplotlib, which is not installed: "
                           "pip install 'fleetdeck[report]'") from None
    starts = [h.samples[0].updated_at for h in runs if h.samples]
    t0 = min(starts) if starts else 0.0
    axis = TimeAxis.spanning(t0, max((h.samples[-1].updated_at for h in runs if h.samples),
                                     default=t0))
    out: list[Plot] = []
    for name, title, caption, fn in PLOTS:
        # hashsalt: the page holds every plot inline, so their clip-path ids must differ.
        with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": name}):
            fig = Figure(figsize=(9.6, 3.4), dpi=100, layout="constrained")
            ax = fig.add_subplot()
            if starts:
                fn(ax, runs, axis)
                ax.set_xlabel(f"{axis.unit} since the run started")
                ax.grid(True, alpha=0.3)
                if not ax.get_legend() and ax.get_legend_handles_labels()[0]:
                    ax.legend(loc="upper right", fontsize="small")
            else:
                ax.text(0.5, 0.5, "no samples recorded", ha="center", va="center",
                        transform=ax.transAxes)
            ax.set_title(title)
            svg, png = io.BytesIO(), io.BytesIO()
            fig.savefig(svg, format="svg", metadata={"Date": None})
            fig.savefig(png, format="png", dpi=120, metadata={"Software": None})
        text = svg.getvalue().decode()
        out.append(Plot(name, title, caption, text[text.index("<svg"):], png.getvalue()))
    return out


# -- the page ---------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #1b1b1b; background: #fff; padding: 0 1rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.1rem; margin: 1.6rem 0 .3rem; }
table { border-collapse: collapse; font-size: .85rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.total td { font-weight: bold; }
figure { margin: 0 0 1rem; } figcaption { font-size: .85rem; color: #555; }
figure svg { width: 100%; height: auto; display: block; }
.notes { color: #8a4b00; }
"""

COLUMNS = ("node", "run", "status", "started (UTC)", "hours", "done / total", "failed",
           "truncated (loops)", "output tokens", "mean tok/s", "peak tok/s", "accept length",
           "GPUs", "GPU-hours", "cost", "ETA at the last sample")


def _when(t: float | None) -> str:
    return "–" if t is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def row_cells(r: Summary) -> list[str]:
    share = r.truncated_share
    cut = f"{r.truncated:,} ({r.truncated_loops:,})"
    if share is not None:
        cut += f", {100 * share:.1f}%"
    return [r.name, r.run, r.status, _when(r.started_at), f"{r.hours:.2f}",
            f"{r.completed:,} / {r.total:,}", f"{r.failed:,}", cut, f"{r.output_tokens:,}",
            _num(r.mean_tok_per_s, ",.0f"), _num(r.peak_tok_per_s, ",.0f"),
            _num(r.mean_accept_length, ".2f"), f"{r.gpus}", f"{r.gpu_hours:.2f}",
            "–" if r.cost_usd is None else f"${r.cost_usd:,.2f}",
            _num(r.eta_hours, ".2f") + (" h" if r.eta_hours is not None else "")]


def page(title: str, source: str, runs: list[RunHistory], plots: list[Plot],
         campaign: str | None = None) -> str:
    rows = [summary(h) for h in runs]
    esc = html.escape
    body = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            # Nothing may be fetched: no script, no style, no image from anywhere.
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; img-src data:\">",
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{esc(title)}</h1>",
            f"<p>From {esc(source)}; written {esc(_when(time.time()))} UTC.</p>",
            '<h2>Summary</h2><table id="summary"><thead><tr>',
            "".join(f"<th>{esc(c)}</th>" for c in COLUMNS), "</tr></thead><tbody>"]
    for r in rows:
        body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row_cells(r)) + "</tr>")
    if campaign is not None and len(rows) > 1:
        t = total(rows, campaign)
        t.peak_tok_per_s = None  # node peaks at different times do not add up
        body.append('<tr class="total">' + "".join(f"<td>{esc(c)}</td>"
                                                   for c in row_cells(t)) + "</tr>")
    body.append("</tbody></table>")
    notes = [f"{h.name}: {h.note}" for h in runs if h.note]
    notes += [f"{h.name}: {h.bad} history lines unreadable, skipped" for h in runs if h.bad]
    if notes:
        body.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes)
                    + "</ul>")
    for p in plots:
        body.append(f'<figure id="plot-{esc(p.name)}"><h2>{esc(p.title)}</h2>{p.svg}'
                    f"<figcaption>{esc(p.caption)} PNG: plots/{esc(p.name)}.png</figcaption>"
                    "</figure>")
    body.append("</body></html>\n")
    return "\n".join(body)


def write(dest: Path, title: str, source: str, runs: list[RunHistory],
          campaign: str | None = None) -> Path:
    """DEST/report.html and DEST/plots/*.png; the page's path."""
    plots = draw(runs)
    make_dirs(dest / "plots")
    for p in plots:
        atomic_write(dest / "plots" / f"{p.name}.png", p.png)
    path = dest / "report.html"
    atomic_write(path, page(title, source, runs, plots, campaign).encode())
    return path
