"""The decommission screen: the gate's checklist item by item (red or green), a progress bar
for pulling what is missing (bytes, files, rate, ETA), one key to pull, one to check again.
It shows what console.artifacts.decommission computes over the link it is lent (only while
the node is connected); its look is in themes/fleetdeck.tcss."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, ProgressBar, Static

from agents.rpc.protocol import RpcError
from console.artifacts.decommission import Checklist, checklist, pull_node
from console.artifacts.pull import PullProgress
from console.artifacts.sources import PullError
from console.fleet import Campaign, Node
from console.sanitize import shown_markup
from console.transport import AgentLink
from console.tui.widgets import figures as f
from console.tui.widgets.keys import key_for
from console.tui.widgets.steady_bar import SteadyBar


def _eta(p: PullProgress) -> str:
    return f"{p.eta_s:.0f} s" if p.eta_s is not None else "?"


class DecommissionScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("u", "pull", "Pull what is missing", id="decommission_pull"),
        Binding("r", "check", "Check again", id="decommission_check"),
        Binding("escape", "close", "Close", id="decommission_close"),
    ]

    def __init__(self, node: Node, pull_dir: Path, link: Callable[[], AgentLink | None],
                 pull_first: bool = False, campaign: Campaign | None = None) -> None:
        """`link` lends the node's link while it is connected (None otherwise)."""
        super().__init__()
        self.node = node.name
        self.node_spec = node
        self.pull_dir = pull_dir
        self._lend_link = link
        self.pull_first = pull_first
        self.campaign = campaign  # a generation campaign's shard: its items are checked too
        self.result: Checklist | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="decommission"):
            yield Label(f"Decommission {self.node}: safe to give the node back?",
                        classes="title")
            yield Static("checking...", id="items")
            yield Label("", id="verdict")
            yield SteadyBar(total=1, show_eta=False, id="pull-bar")
            yield Label("", id="pull-label")
            yield Label(f"{key_for(self, 'decommission_pull')} pull what is missing · "
                        f"{key_for(self, 'decommission_check')} check again · "
                        f"{key_for(self, 'decommission_close')} close", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#pull-bar", ProgressBar).display = False
        if self.pull_first:
            self.action_pull()
        else:
            self.action_check()

    def show_checklist(self, result: Checklist) -> None:
        self.result = result
        lines = []
        for item in result.items:
            mark = "✓" if item.ok else "✗"
            lines.append(f"[{'$success' if item.ok else '$error'}]{mark} {item.name}[/]: "
                         f"{shown_markup(item.detail)}")
            for m in item.missing[:8]:
                lines.append(f"      - {shown_markup(m)}")
            if len(item.missing) > 8:
                lines.append(f"      ... and {len(item.missing) - 8} more")
        self.query_one("#items", Static).update("\n".join(lines))
        verdict = self.query_one("#verdict", Label)
        verdict.update("SAFE to give the node back" if result.ok
                       else "NOT safe to give the node back")
        verdict.set_classes("verdict-ok" if result.ok else "verdict-bad")

    def show_progress(self, p: PullProgress) -> None:
        bar = self.query_one("#pull-bar", ProgressBar)
        bar.display = True
        bar.update(total=max(p.bytes_total, 1), progress=p.bytes_done)
        self.query_one("#pull-label", Label).update(
            f"pull: {p.files_done}/{p.files_total} files, {f.size(p.bytes_done)} of "
            f"{f.size(p.bytes_total)}, {f.size(int(p.rate))}/s, ETA {_eta(p)}")

    def _error(self, text: str) -> None:
        self.query_one("#items", Static).update(f"[$error]{shown_markup(text)}[/]")
        self.query_one("#verdict", Label).update("")

    @work(exclusive=True, group="decommission", exit_on_error=False)
    async def action_check(self) -> None:
        await self._check()

    async def _check(self) -> None:
        link = self._lend_link()
        if link is None:
            self._error(f"{self.node} is not connected")
            return
        self.query_one("#items", Static).update("checking...")
        try:
            result = await checklist(link, self.node_spec, self.pull_dir, self.campaign)
        except RpcError as exc:
            self._error(f"the check was refused: {exc.message}")
            return
        except (PullError, ConnectionError, TimeoutError, OSError) as exc:
            self._error(f"the check failed: {exc}")
            return
        self.show_checklist(result)

    @work(exclusive=True, group="decommission", exit_on_error=False)
    async def action_pull(self) -> None:
        link = self._lend_link()
        if link is None:
            self._error(f"{self.node} is not connected")
            return
        label = self.query_one("#pull-label", Label)
        self.query_one("#pull-bar", ProgressBar).display = True
        label.update(f"pulling into {self.pull_dir} ...")
        try:
            report = await pull_node(link, self.node_spec, self.pull_dir,
                                     on_progress=self.show_progress)
        except RpcError as exc:
            label.update(shown_markup(f"pull refused: {exc.message}"))
            return
        except (PullError, ConnectionError, TimeoutError, OSError) as exc:
            label.update(shown_markup(f"pull failed: {exc}"))
            return
        done = (f"pulled: {len(report.copied)} copied, {len(report.skipped)} already here, "
                f"{f.size(report.bytes_transferred)} transferred")
        if report.failed:
            done += f"; {len(report.failed)} failed ({shown_markup(next(iter(report.failed)))})"
        label.update(done)
        await self._check()

    def action_close(self) -> None:
        self.dismiss(None)
