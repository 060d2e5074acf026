"""The generation node's per-GPU table, one row per server (its GPU, or its group of GPUs:
`0-1`): server state (with the requests it retracted recently: its KV pool is full; why its
process last exited, `gave up: ...` when the supervisor stopped restarting it),
restarts, in-flight / limit, the auto-tuner's chosen level with its measured
tokens/s-by-concurrency curve, queue, req/s, tok/s, accept length, failures, and the GPUs'
utilisation, memory, temperature and power, the group's together (`–` where NVML is absent:
unknown is never drawn as 0)."""

from __future__ import annotations

from rich.text import Text
from textual.theme import Theme

from agents.rundir.gpugroups import label as gpu_label
from agents.rundir.schema import EXIT_CAUSES, AutoTune, ServerStatus, Snapshot
from console.sanitize import shown
from console.tui.widgets import figures as f
from console.tui.widgets.graphs import knee_plot
from console.tui.widgets.live_table import LiveTable, Row
from console.tui.widgets.tones import SERVER_TONE, style

GPU_COLUMNS = (("gpu", "GPU", None), ("state", "State", 22), ("restarts", "Restarts", 8),
               ("in_flight", "In flight", 9), ("auto", "Auto-tune", 13), ("queue", "Queue", 5),
               ("req_s", "req/s", 6),
               ("tok_s", "tok/s", 6), ("accept", "Accept", 6), ("failed", "Failed", 7),
               ("util", "Util", 5), ("mem", "Memory", 14), ("temp", "Temp", 5),
               ("power", "Power", 6))
METRICS_STALE_S = 15.0


def tok_per_s(s: ServerStatus) -> float | None:
    """Output tokens/s: what the engine measured on a server it sends to; for one it does not
    (no engine row: limit 0), SGLang's own generation throughput, unknown if it gives none
    (an engine's 0.0 there would be no measurement, not a zero)."""
    return s.tok_per_s if s.limit > 0 else s.gen_throughput


# The few letters a State cell has room for; the run panel's latest errors say it all.
SHORT_CAUSES = {"unknown_argument": "unknown arg", "bad_argument": "bad arg",
                "missing_model": "no model", "model_unreachable": "no Hub"}


def exit_cause(s: ServerStatus) -> str:
    """Why the server's process exited, in a word or two; a kind this console does not know
    (a newer agent's) as sent, escaped."""
    kind = s.exit_cause or "exited"
    return SHORT_CAUSES.get(kind) or EXIT_CAUSES.get(kind) or shown(kind)


def accept_length(s: ServerStatus) -> float | None:
    for v in (s.accept_length, s.accept_length_window, s.accept_length_cum,
              s.accept_length_log):
        if v is not None:
            return v
    return None


def auto_cell(tune: AutoTune | None, theme: Theme, dim: str) -> Text:
    """`▁▃▅▇█▇ 32`: the curve measured so far and the level chosen; `…` while it measures.
    A dash: the server's concurrency is set by hand."""
    if tune is None:
        return Text(f.DASH, style=dim or "dim")
    settled = tune.phase == "settled"
    text = knee_plot(tune.curve, tune.level, chosen_style=dim or style(theme, "accent"),
                     width=8)
    text.append(f" {tune.level}" + ("" if settled else "…"),
                style=dim or (style(theme, "good") if settled else style(theme, "accent")))
    return text


def gpu_row(s: ServerStatus, at: float, theme: Theme, stale: bool,
            tune: AutoTune | None = None) -> Row:
    dim = style(theme, "muted") if stale else ""
    group = s.gpu_group
    label = gpu_label(group) if group else f"#{s.number}"
    state: str = s.state
    tone: str | None = SERVER_TONE.get(s.state)
    if s.metrics_at is not None and at - s.metrics_at > METRICS_STALE_S:
        state += f" ({f.age(at - s.metrics_at)} old)"  # its metrics: not refreshed
        tone = "warn"
    if s.restarts_stopped:
        state = f"gave up: {exit_cause(s)}"
        tone = "bad"
    elif s.exit_cause and s.state in ("down", "restarting"):
        # Why its process exited (the whole line: the run panel's latest errors). Not while
        # it starts again: `starting: out of memory` would read as this start's.
        state += f": {exit_cause(s)}"
    if s.retracted_recent:
        # Its KV pool is full: requests go back to its queue and start again (kv_pressure).
        state += f", {s.retracted_recent} retracted"
        tone = "warn" if tone in (None, "good") else tone
    g = s.gpu_stats
    util = mem = temp = power = f.DASH
    if g is not None:
        util = f"{g.util_pct:.0f}%" if g.util_pct is not None else f.DASH
        if g.mem_used_mib is not None:
            total = f"/{g.mem_total_mib / 1024:.0f}" if g.mem_total_mib is not None else ""
            mem = f"{g.mem_used_mib / 1024:.1f}{total} GiB"
        temp = f"{g.temp_c:.0f}°C" if g.temp_c is not None else f.DASH
        power = f"{g.power_w:.0f} W" if g.power_w is not None else f.DASH
    acc = accept_length(s)
    restarts = Text(str(s.restarts), style=dim or (style(theme, "warn") if s.restarts else ""))
    failed = Text(f.num(s.failed), style=dim or (style(theme, "warn") if s.failed else ""))
    cells = (f.num(s.queued_reqs), f.num(s.req_per_s, 2), f.si(tok_per_s(s)),
             f"{acc:.2f}" if acc is not None else f.DASH)
    return (Text(label, style="bold"), Text(state, style=dim or style(theme, tone)), restarts,
            Text(f"{s.in_flight}/{s.limit}", style=dim), auto_cell(tune, theme, dim),
            *(Text(c, style=dim) for c in cells), failed,
            *(Text(c, style=dim) for c in (util, mem, temp, power)))


class GpuTable(LiveTable):
    COLUMNS = GPU_COLUMNS

    def show(self, snap: Snapshot | None, theme: Theme, stale: bool) -> None:
        if snap is None:
            self.sync({})
            return
        tunes = {k: sp.autotune for k, sp in snap.progress.servers.items()} \
            if snap.progress is not None else {}
        self.sync({str(s.number): gpu_row(s, snap.updated_at, theme, stale,
                                          tunes.get(str(s.number)))
                   for s in snap.servers})

    @property
    def selected_server(self) -> int | None:
        key = self.selected_key
        return int(key) if key is not None else None
