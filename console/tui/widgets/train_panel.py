"""The training node: step / total, loss, accuracy per block position, estimated accept
length, tokens/s, learning rate, ETA, last and best checkpoint, GPU stats. Drawn from
`snapshot.train` (the trainer's progress.json, a TrainProgress) and the GPU stats of the
snapshot's server rows."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.theme import Theme
from textual.widgets import ProgressBar, Static

from agents.rundir.gpugroups import label as gpu_label
from agents.rundir.schema import GpuStats, Snapshot, TrainProgress
from console.linkstate import LinkState
from console.sanitize import shown
from console.tui.widgets import figures as f
from console.tui.widgets.live_table import LiveTable, Row
from console.tui.widgets.run_panel import headline
from console.tui.widgets.steady_bar import SteadyBar
from console.tui.widgets.tones import style

BAR_WIDTH = 24


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


def train_grid(t: TrainProgress | None, theme: Theme, stale: bool) -> RenderableType:
    """The trainer's figures; dashes for every one while no progress.json was read."""
    dim = style(theme, "muted") if stale else ""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(ratio=1)

    def cell(text: str) -> Text:
        return Text(text, style=dim)

    loss = t.loss if t is not None else None
    acc_len = t.accept_length if t is not None else None
    held = t.heldout_accept_length if t is not None else None
    best = t.best_accept_length if t is not None else None
    accept = f"{acc_len:.2f}" if acc_len is not None else f.DASH
    if held is not None:
        accept += f" · held-out {held:.2f}"
    if best is not None:
        accept += f" · best {best:.2f}"
    epoch = f.num(t.epoch if t is not None else None) + \
        (f" / {f.num(t.epochs)}" if t is not None and t.epochs else "")
    lr = t.lr if t is not None else None
    grid.add_row("Loss", cell(f"{loss:.4f}" if loss is not None else f.DASH),
                 "Accept length", cell(accept))
    grid.add_row("Tokens/s", cell(f.rate(t.tokens_per_s if t is not None else None, " tok/s")),
                 "Steps/s", cell(f.num(t.steps_per_s if t is not None else None, 2)))
    grid.add_row("Learning rate", cell(f"{lr:.2e}" if lr is not None else f.DASH),
                 "Epoch", cell(epoch))
    grid.add_row("ETA", cell(f"{f.hours(t.eta_hours if t is not None else None)} (elapsed "
                             f"{f.hours(t.elapsed_hours if t is not None else None)})"),
                 "GPUs", cell(f.num(t.world_size if t is not None else None)))
    last = t.last_checkpoint if t is not None else None
    best_ckpt = t.best_checkpoint if t is not None else None
    grid.add_row("Last checkpoint", cell(last or f.DASH), "", "")
    grid.add_row("Best checkpoint", cell(best_ckpt or f.DASH), "", "")
    return grid


TRAIN_GPU_COLUMNS = (("gpu", "GPU", None), ("util", "Util", 5), ("mem", "Memory", 14),
                     ("temp", "Temp", 5), ("power", "Power", 6))


def gpu_rows(snap: Snapshot, stale: bool) -> dict[str, Row]:
    """One row per GPU the snapshot's server rows carry stats for (NVML on the node)."""
    items: list[tuple[str, GpuStats]] = [
        (gpu_label(group) if (group := s.gpu_group) else str(s.number), s.gpu_stats)
        for s in snap.servers if s.gpu_stats is not None]
    dim = "dim italic" if stale else ""
    rows: dict[str, Row] = {}
    for label, g in items:
        util, used, total = g.util_pct, g.mem_used_mib, g.mem_total_mib
        temp, power = g.temp_c, g.power_w
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
        yield SteadyBar(total=None, show_eta=False, id="train-progress")
        yield Static(id="train-grid")
        yield Static(id="train-accuracy")

    def show(self, snap: Snapshot | None, theme: Theme, age: float | None, link: LinkState,
             error: str | None) -> None:
        head = self.query_one("#train-headline", Static)
        if snap is None:
            head.update(Text(link + (f": {error}" if error else ""),
                             style=style(theme, "warn")))
            return
        stale = link != "connected" or age is None or age > 5
        t = snap.train
        text = headline(snap, theme, age, link)
        if t is not None:
            text.append(f"   step {f.num(t.step)} / {f.num(t.total_steps)} "
                        f"({f.pct(t.step, t.total_steps)})")
        head.update(text)
        if t is not None and t.total_steps:
            self.query_one("#train-progress", ProgressBar).update(total=t.total_steps,
                                                                  progress=t.step)
        body: list[RenderableType] = [train_grid(t, theme, stale)]
        message = (t.message if t is not None else None) or snap.message
        if message:
            body.append(Text(shown(message), style=style(theme, "warn")))
        self.query_one("#train-grid", Static).update(Group(*body))
        chart: RenderableType = Text("accuracy per block position: not measured yet",
                                     style="dim")
        if t is not None and t.accuracy:
            chart = Group(Text("Accuracy per block position", style="bold"),
                          accuracy_chart(t.accuracy, theme))
        self.query_one("#train-accuracy", Static).update(chart)
