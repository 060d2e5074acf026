"""The training node: step / total, loss, accuracy per block position, estimated accept
length, tokens/s, learning rate, ETA, last and best checkpoint, GPU stats. Drawn from
`snapshot.train` (the trainer's progress.json): whatever keys are present."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.theme import Theme
from textual.widgets import ProgressBar, Static

from agents.rundir.schema import Snapshot
from console.tui.widgets import figures as f
from console.tui.widgets.live_table import LiveTable, Row
from console.tui.widgets.run_panel import headline
from console.tui.widgets.tones import style

BAR_WIDTH = 24


def _float(t: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = t.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def accuracy_chart(acc: list[float], theme: Theme) -> RenderableType:
    """One bar per block position, in two columns."""
    grid = Table.grid(padding=(0, 1))
    half = (len(acc) + 1) // 2
    for _ in range(2):
        grid.add_column(justify="right", style="bold")
        grid.add_column(no_wrap=True)
        grid.add_column(justify="right")
    for i in range(half):
        row: list[RenderableType] = []
        for j in (i, i + half):
            if j < len(acc):
                v = max(0.0, min(1.0, float(acc[j])))
                filled = round(v * BAR_WIDTH)
                bar = Text("█" * filled, style=theme.primary or "blue")
                bar.append("░" * (BAR_WIDTH - filled), style="dim")
                row += [f"{j + 1}", bar, f"{v:.3f}"]
            else:
                row += ["", "", ""]
        grid.add_row(*row)
    return grid


def train_grid(t: dict[str, Any], theme: Theme, stale: bool) -> RenderableType:
    dim = style(theme, "muted") if stale else ""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(ratio=1)

    def cell(text: str) -> Text:
        return Text(text, style=dim)

    loss = _float(t, "loss")
    acc_len = _float(t, "accept_length")
    held = _float(t, "heldout_accept_length")
    best = _float(t, "best_accept_length")
    accept = f"{acc_len:.2f}" if acc_len is not None else f.DASH
    if held is not None:
        accept += f" · held-out {held:.2f}"
    if best is not None:
        accept += f" · best {best:.2f}"
    epoch = f"{f.num(t.get('epoch'))}" + (f" / {f.num(t.get('epochs'))}" if t.get("epochs")
                                          else "")
    lr = _float(t, "lr")
    grid.add_row("Loss", cell(f"{loss:.4f}" if loss is not None else f.DASH),
                 "Accept length", cell(accept))
    grid.add_row("Tokens/s", cell(f.rate(_float(t, "tokens_per_s"), " tok/s")),
                 "Steps/s", cell(f.num(_float(t, "steps_per_s"), 2)))
    grid.add_row("Learning rate", cell(f"{lr:.2e}" if lr is not None else f.DASH),
                 "Epoch", cell(epoch))
    grid.add_row("ETA", cell(f"{f.hours(_float(t, 'eta_hours'))} (elapsed "
                             f"{f.hours(_float(t, 'elapsed_hours'))})"),
                 "GPUs", cell(f.num(t.get("world_size"))))
    grid.add_row("Last checkpoint", cell(str(t.get("last_checkpoint") or f.DASH)), "", "")
    grid.add_row("Best checkpoint", cell(str(t.get("best_checkpoint") or f.DASH)), "", "")
    return grid


TRAIN_GPU_COLUMNS = (("gpu", "GPU", None), ("util", "Util", 5), ("mem", "Memory", 14),
                     ("temp", "Temp", 5), ("power", "Power", 6))


def gpu_rows(snap: Snapshot, stale: bool) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    items: list[tuple[str, dict[str, Any]]] = []
    for s in snap.servers:
        if s.gpu_stats is not None:
            label = str(s.gpu if s.gpu is not None else s.number)
            items.append((label, {"util_pct": s.gpu_stats.util_pct,
                                  "mem_used_mib": s.gpu_stats.mem_used_mib,
                                  "mem_total_mib": s.gpu_stats.mem_total_mib,
                                  "temp_c": s.gpu_stats.temp_c,
                                  "power_w": s.gpu_stats.power_w}))
    gpus = (snap.train or {}).get("gpus")
    if isinstance(gpus, list):
        for i, g in enumerate(gpus):
            if isinstance(g, dict):
                items.append((str(g.get("gpu", i)), g))
    dim = "dim italic" if stale else ""
    for label, g in items:
        util, used, total = g.get("util_pct"), g.get("mem_used_mib"), g.get("mem_total_mib")
        temp, power = g.get("temp_c"), g.get("power_w")
        mem = f.DASH if used is None else \
            f"{used / 1024:.1f}" + (f"/{total / 1024:.0f}" if total is not None else "") + " GiB"
        rows[label] = (Text(label, style="bold"),
                       *(Text(c, style=dim) for c in (
                           f"{util:.0f}%" if util is not None else f.DASH, mem,
                           f"{temp:.0f}°C" if temp is not None else f.DASH,
                           f"{power:.0f} W" if power is not None else f.DASH)))
    return rows


class TrainGpuTable(LiveTable):
    COLUMNS = TRAIN_GPU_COLUMNS


class TrainPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="train-headline")
        yield ProgressBar(total=None, show_eta=False, id="train-progress")
        yield Static(id="train-grid")
        yield Static(id="train-accuracy")

    def show(self, snap: Snapshot | None, theme: Theme, age: float | None, link: str,
             error: str | None) -> None:
        head = self.query_one("#train-headline", Static)
        if snap is None:
            head.update(Text(link + (f": {error}" if error else ""),
                             style=style(theme, "warn")))
            return
        stale = link != "connected" or age is None or age > 5
        t = snap.train or {}
        text = headline(snap, theme, age, link)
        step, total = t.get("step"), t.get("total_steps")
        if isinstance(step, int):
            text.append(f"   step {f.num(step)} / {f.num(total)} "
                        f"({f.pct(step, total)})")
        head.update(text)
        if isinstance(step, int) and isinstance(total, int) and total:
            self.query_one("#train-progress", ProgressBar).update(total=total, progress=step)
        body: list[RenderableType] = [train_grid(t, theme, stale)]
        if t.get("message") or snap.message:
            body.append(Text(str(t.get("message") or snap.message), style=style(theme, "warn")))
        self.query_one("#train-grid", Static).update(Group(*body))
        acc = t.get("accuracy") or t.get("acc_per_position") or []
        chart: RenderableType = Text("accuracy per block position: not measured yet",
                                     style="dim")
        if isinstance(acc, list) and acc:
            chart = Group(Text("Accuracy per block position", style="bold"),
                          accuracy_chart([float(a) for a in acc], theme))
        self.query_one("#train-accuracy", Static).update(chart)
