"""The generation run panel: progress bar, rate and ETA with its p10-p90 band, tokens,
average output, truncation, empty and failure rates with the latest errors, S3 uploaded /
pending, free disk, what the run costs, and the live controls (max_tokens, concurrency or
auto-tune, paused)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.theme import Theme
from textual.widgets import ProgressBar

from agents.rundir.gpugroups import label as gpu_label
from agents.rundir.schema import Cost, Progress, Snapshot
from console.linkstate import LinkState
from console.sanitize import shown
from console.tui.widgets import figures as f
from console.tui.widgets.live_static import LiveStatic
from console.tui.widgets.steady_bar import SteadyBar
from console.tui.widgets.tones import RUN_TONE, style, toned

PROGRESS_STALE_S = 10.0


def latest_errors(snap: Snapshot, n: int = 3) -> list[str]:
    out = []
    pg = snap.pager
    if pg is not None and (pg.dropped or (pg.pending and pg.last_error)):
        # The node's own pager is in trouble: pages wait (the receiver is down) or were lost.
        out.append(f"pages: {pg.pending} waiting, {pg.dropped} dropped"
                   + (f": {shown(pg.last_error)}" if pg.last_error else ""))
    for s in snap.servers:
        if s.last_error:
            group = s.gpu_group
            where = f"GPU {gpu_label(group)}" if group else f"server {s.number}"
            out.append(f"{where}: {shown(s.last_error)}")
    return out[:n]


def cost_line(p: Progress, cost: Cost | None, own_price: bool) -> tuple[str, str]:
    """(money, GPU time) for the Cost row: `$35.00 · $5.00/M tok · ~$75.00 at end` (so far,
    per million output tokens, projected) and `14.0 GPU-h · 8 GPUs × $2.50/h`, the price
    marked `(fleet)` when it is the fleet file's."""
    gpus = f"{f.num(p.gpu_hours, 1)} GPU-h · {p.gpus} GPU{'s' if p.gpus != 1 else ''}"
    if cost is None:
        return f"{f.DASH} (no [run] cost_per_gpu_hour)", gpus
    money = f"{f.usd(cost.usd)} · {f.usd(cost.per_mtok_usd)}/M tok"
    if cost.projected_usd is not None:
        money += f" · ~{f.usd(cost.projected_usd)} at end"
    return money, gpus + f" × {f.usd(cost.per_gpu_hour)}/h" + (" (fleet)" if own_price else "")


def concurrency_text(p: Progress) -> str:
    """`concurrency 40`, or `auto on 4 GPUs` when the tuner holds servers (the GPU table
    shows each one's level)."""
    tuned = sum(1 for sp in p.servers.values() if sp.autotune is not None)
    if not tuned:
        return f"concurrency {p.concurrency}"
    return f"auto on {tuned} GPU{'s' if tuned != 1 else ''}"


def run_grid(snap: Snapshot, theme: Theme, stale: bool,
             price: float | None = None, cost: Cost | None = None) -> Table:
    """`cost`: the run's cost as the console shows it (at `price`, the fleet file's, if set).
    Its cells are Texts or labels (the panel compares them to skip a redraw)."""
    p = snap.progress
    dim = style(theme, "muted") if stale else ""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(ratio=1)
    if p is None:
        grid.add_row("Progress", Text("no progress.json yet", style="dim"), "", "")
        return grid
    tok_s = sum(s.tok_per_s for s in snap.servers) if snap.servers else None
    done = p.completed + p.failed
    fail_tone = "bad" if p.failed and p.failed / max(1, done) > 0.01 else None
    grid.add_row("Rate", Text(f"{f.rate(p.rate_per_sec, ' req/s', 2)} · "
                              f"{f.rate(tok_s, ' tok/s')}", style=dim),
                 "ETA", Text(f"{f.eta(p.eta_hours, p.eta_p10_hours, p.eta_p90_hours)} · "
                             f"elapsed {f.hours(p.elapsed_hours)}", style=dim))
    grid.add_row("Tokens", Text(f"in {f.si(p.total_input_tokens)} · out "
                                f"{f.si(p.total_output_tokens, 2)}", style=dim),
                 "Avg output", Text(f"{f.num(p.avg_output_tokens)} tokens", style=dim))
    trunc_tone = "warn" if p.completed and p.truncated / p.completed > 0.1 else None
    empty_tone = "bad" if p.completed and p.empty / p.completed > 0.05 else None
    # Loops (repetition, agents/engine/loops.py) gain nothing from a retry: shown apart.
    split = (f" · loops {f.num(p.truncated_loops)}, long {f.num(p.truncated - p.truncated_loops)}"
             if p.truncated_loops else "")
    grid.add_row("Truncated", Text(f"{f.pct(p.truncated, p.completed)} "
                                   f"({f.num(p.truncated)}){split}",
                                   style=dim or style(theme, trunc_tone)),
                 "Empty", Text(f"{f.pct(p.empty, p.completed)} ({f.num(p.empty)})",
                               style=dim or style(theme, empty_tone)))
    grid.add_row("Failed", Text(f"{f.pct(p.failed, done, 2)} ({f.num(p.failed)}) · "
                                f"retried {f.num(p.retried)}",
                                style=dim or style(theme, fail_tone)),
                 "In flight", Text(f"{f.num(p.in_flight)}", style=dim))
    s3 = Text(f"{f.num(p.s3_uploaded)} uploaded ({f.size(p.s3_bytes)}) · "
              f"{f.num(p.s3_pending)} pending", style=dim)
    if p.s3_error:
        s3.append(f"  {p.s3_error}", style=style(theme, "bad"))
    disk = Text(f.DASH)
    if snap.disk is not None:
        d = snap.disk
        full = f" · full in {f.hours(d.hours_to_full)}" if d.hours_to_full is not None else ""
        low = d.total_bytes and d.free_bytes / d.total_bytes < 0.05
        disk = Text(f"{f.size(d.free_bytes)} free of {f.size(d.total_bytes)}{full}",
                    style=dim or style(theme, "bad" if low else None))
    grid.add_row("S3", s3, "Disk", disk)
    money, gpu_hours = cost_line(p, cost, price is not None)
    grid.add_row("Cost", Text(money, style=dim), "GPU time", Text(gpu_hours, style=dim))
    controls = Text(f"max_tokens {f.num(p.max_tokens)} · {concurrency_text(p)}"
                    f" · rev {p.control_rev}", style=dim)
    if p.paused:
        controls.append("  PAUSED", style=style(theme, "warn") + " bold")
    if p.tail:  # the last requests go out twice to idle servers (hedging)
        controls.append(f"  TAIL {p.hedges} hedged", style=style(theme, "warn"))
    grid.add_row("Control", controls, "Batches", Text(f"{f.num(p.batches_closed)} closed",
                                                      style=dim))
    return grid


def error_lines(snap: Snapshot, theme: Theme) -> Text | None:
    errors = latest_errors(snap)
    if not errors:
        return None
    text = Text()
    for i, err in enumerate(errors):
        text.append("\n" if i else "")
        text.append("Errors    " if i == 0 else "          ", style="bold")
        text.append(err, style=style(theme, "bad"))
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def headline(snap: Snapshot, theme: Theme, age: float | None, link: LinkState) -> Text:
    text = Text()
    text.append(f"{shown(snap.run)}  ", style="bold")
    text.append(shown(snap.status), style=style(theme, RUN_TONE.get(snap.status)))
    if snap.source == "disk":
        text.append("  (from the run directory: no supervisor)", style=style(theme, "warn"))
    p = snap.progress
    if p is not None:
        text.append(f"   {f.num(p.completed)} / {f.num(p.total)} "
                    f"({f.pct(p.completed, p.total)})")
    if snap.progress_age_s is not None and snap.progress_age_s > PROGRESS_STALE_S:
        text.append(f"   progress.json {f.age(snap.progress_age_s)} old",
                    style=style(theme, "warn"))
    if link != "connected":
        text.append(f"   {link}", style=style(theme, "bad"))
    if age is not None and (link != "connected" or age > 5):
        text.append(f"   figures {f.age(age)} old", style=style(theme, "warn"))
    return text


def grid_texts(grid: Table) -> list[Text]:
    """Every cell of a grid as Text, column by column (what the panel compares)."""
    return [cell if isinstance(cell, Text) else Text(str(cell))
            for column in grid.columns for cell in column.cells]


class RunPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield LiveStatic(id="run-headline")
        yield SteadyBar(total=None, show_eta=False, id="run-progress")
        yield LiveStatic(id="run-grid")

    def show(self, snap: Snapshot | None, theme: Theme, age: float | None, link: LinkState,
             error: str | None, price: float | None = None, cost: Cost | None = None) -> None:
        head = self.query_one("#run-headline", LiveStatic)
        grid = self.query_one("#run-grid", LiveStatic)
        bar = self.query_one("#run-progress", ProgressBar)
        if snap is None:
            head.draw(toned(f"{link}" + (f": {error}" if error else ""), theme,
                            "warn" if link in ("connecting", "reconnecting") else "bad"))
            grid.draw(Text(""))
            return
        stale = link != "connected" or age is None or age > 5
        head.draw(headline(snap, theme, age, link))
        p = snap.progress
        if p is not None and p.total and (bar.total, bar.progress) != (p.total, p.completed):
            bar.update(total=p.total, progress=p.completed)
        table = run_grid(snap, theme, stale, price, cost)
        texts = grid_texts(table)
        body: list[RenderableType] = [table]
        errors = error_lines(snap, theme)
        if errors is not None:
            body.append(errors)
        if snap.message:
            body.append(Text(shown(snap.message), style=style(theme, "warn")))
        if error and link != "connected":
            body.append(Text(shown(error), style=style(theme, "bad")))
        # the grid's shape, then the lines under it
        texts += [Text(str(len(table.rows)))] + [t for t in body[1:] if isinstance(t, Text)]
        grid.draw(Group(*body), texts)
