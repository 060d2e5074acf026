"""A campaign's screen: the roll-up in the bar (the queue's chunks committed of all, lines
done, rate, the ETA of what is left, failures, truncation), what needs a person (a node that
cannot reach the queue, a node of another campaign), a row per node, and the nodes' alerts.
Actions here apply to every node of the campaign; enter on a node opens it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Footer, Label, Static

from console.queue.rollup import Rollup, from_state
from console.sanitize import shown
from console.tui.screens.base import View, ViewContext
from console.tui.widgets import figures as f
from console.tui.widgets.alert_list import AlertList
from console.tui.widgets.campaign_table import MemberTable
from console.tui.widgets.keys import key_for
from console.tui.widgets.tones import RUN_TONE, style


def campaign_bar(r: Rollup, ctx: ViewContext) -> Text:
    """` qwen-all   generate campaign · 2/2 live · running · 863.2k/1.8M (47.2%) · 14.37 req/s
    · failed 1,188 · truncated 17.5% · ETA 10.4 h (9.1 h–12.2 h) gen-2`"""
    text = Text()
    text.append(f" {r.campaign} ", style="bold reverse")
    live = sum(1 for s in r.rows if s.link == "connected")
    text.append(f"  {r.role} campaign · ")
    text.append(f"{live}/{r.nodes} live", style=style(ctx.theme, "warn" if live < r.nodes
                                                             else None))
    text.append(" · ")
    text.append(r.status, style=style(ctx.theme, RUN_TONE.get(r.status)))
    if r.role == "train":
        if r.step is not None:
            text.append(f" · step {f.num(r.step)}/{f.num(r.total_steps)} (rank 0)")
    else:
        if r.chunks is not None:
            text.append(f" · {f.num(r.committed)}/{f.num(r.chunks)} chunks "
                        f"({f.pct(r.committed or 0, r.chunks)})")
        text.append(f" · {f.si(r.completed)} lines"
                    f" · {f.rate(r.rate_per_sec, ' req/s', 2)} · failed {f.num(r.failed)} · "
                    f"truncated {f.pct(r.truncated, r.completed)}")
    text.append(f" · ETA {f.eta(r.eta_hours, r.eta_p10_hours, r.eta_p90_hours)}")
    if r.slowest is not None and r.eta_hours is not None:
        text.append(f" {r.slowest}")
    if not r.complete:
        text.append(f" · {r.answered} of {r.nodes} answered", style=style(ctx.theme, "warn"))
    if ctx.read_only:
        text.append("   READ-ONLY", style=style(ctx.theme, "warn") + " bold")
    return text


class CampaignScreen(View):
    class OpenNode(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, campaign: str) -> None:
        super().__init__(name=campaign)
        self.campaign_name = campaign
        self.rollup: Rollup | None = None  # the one drawn last

    def compose(self) -> ComposeResult:
        yield Static(id="campaign-bar", classes="bar")
        yield Static(id="campaign-warnings")
        yield MemberTable(id="member-table")
        yield Label("Alerts", classes="pane-title")
        yield AlertList(id="campaign-alerts")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(MemberTable).focus()

    def show(self, ctx: ViewContext) -> None:
        r = self.rollup = from_state(ctx.state, ctx.state.fleet.campaign(self.campaign_name))
        self.query_one("#campaign-bar", Static).update(campaign_bar(r, ctx))
        warnings = self.query_one("#campaign-warnings", Static)
        warnings.display = bool(r.warnings)
        warnings.update(Text("\n".join(f"⚠ {shown(w)}" for w in r.warnings),
                             style=style(ctx.theme, "warn")))
        self.query_one(MemberTable).show(r, ctx.state, ctx.now, ctx.theme)
        self.query_one(AlertList).show([(a.node, a.alert) for a in r.alerts], ctx.now,
                                       ctx.theme, lambda action: key_for(self, action))

    def forget(self) -> None:
        self.query_one(MemberTable).forget()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.OpenNode(str(event.row_key.value)))
