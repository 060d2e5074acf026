"""The failures screen: what is failing on a node, by error class (HTTP status, timeout,
deadline, abort, bad input, server down...), with counts, first and last time, the servers
involved, and the example lines of the class under the cursor. It shows what
console.failures fetches over the link it is lent (only while the node is connected); its
look is in themes/fleetdeck.tcss."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

from agents.rpc.protocol import RpcError
from agents.rundir.schema import FailureGroup, FailureSummary
from console.failures import BadAnswer, class_label, fetch, headline, servers_text
from console.sanitize import shown, shown_markup
from console.transport import AgentLink
from console.tui.widgets import figures as f
from console.tui.widgets.keys import key_for

COLUMNS = ("event", "class", "count", "first", "last", "servers")


def _when(t: float, now: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(t)) + f" ({f.age(max(now - t, 0.0))} ago)"


class FailuresScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "refresh", "Read again", id="failures_refresh"),
        Binding("escape", "close", "Close", id="failures_close"),
    ]

    def __init__(self, node: str, link: Callable[[], AgentLink | None],
                 clock: Callable[[], float], summary: FailureSummary | None = None) -> None:
        """`link` lends the node's link while it is connected (None otherwise); `summary`:
        one to show at once (tests), else it is fetched."""
        super().__init__()
        self.node = node
        self._lend_link = link
        self._clock = clock
        self.summary = summary

    def compose(self) -> ComposeResult:
        with Vertical(id="failures"):
            yield Label(f"Failures on {self.node}: failures.jsonl by error class",
                        classes="title")
            yield Label("reading...", id="failures-headline")
            table: DataTable[Text] = DataTable(id="failures-table", cursor_type="row",
                                                     zebra_stripes=True)
            yield table
            yield Static("", id="failures-examples")
            yield Label(f"{key_for(self, 'failures_refresh')} read again · "
                        f"{key_for(self, 'failures_close')} close", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one("#failures-table", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        if self.summary is not None:
            self.show_summary(self.summary)
        else:
            self.action_refresh()

    def show_summary(self, s: FailureSummary) -> None:
        self.summary = s
        now = self._clock()
        self.query_one("#failures-headline", Label).update(shown_markup(headline(s)))
        table = self.query_one("#failures-table", DataTable)
        keep = table.cursor_row
        table.clear()
        for i, g in enumerate(s.groups):
            # Text cells: a node's string is never read as markup.
            table.add_row(Text(shown(g.event)), Text(class_label(g.event, g.error)),
                          Text(f"{g.count:,}", justify="right"), Text(_when(g.first, now)),
                          Text(_when(g.last, now)), Text(servers_text(g)), key=str(i))
        if s.groups:
            table.move_cursor(row=min(keep, len(s.groups) - 1))
            self._examples(s.groups[table.cursor_row])
        else:
            self.query_one("#failures-examples", Static).update(
                "nothing has failed" if not s.other else "")

    def _examples(self, g: FailureGroup) -> None:
        lines = [f"[b]{shown_markup(class_label(g.event, g.error))}[/b]: "
                 f"{g.count:,} {shown_markup(g.event)}, the first and the latest lines"]
        lines += [f"  line {e.line}: {shown_markup(e.text)}" for e in g.examples]
        self.query_one("#failures-examples", Static).update("\n".join(lines))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.summary is not None and event.row_key.value is not None:
            i = int(event.row_key.value)
            if 0 <= i < len(self.summary.groups):
                self._examples(self.summary.groups[i])

    def _error(self, text: str) -> None:
        self.query_one("#failures-headline", Label).update(f"[$error]{shown_markup(text)}[/]")

    @work(exclusive=True, group="failures", exit_on_error=False)
    async def action_refresh(self) -> None:
        link = self._lend_link()
        if link is None:
            self._error(f"{self.node} is not connected")
            return
        try:
            summary = await fetch(link, on_step=self.show_summary)
        except RpcError as exc:
            self._error(f"failures refused: {exc.message}")
            return
        except BadAnswer as exc:
            self._error(str(exc))
            return
        except (ConnectionError, TimeoutError, OSError) as exc:
            self._error(f"failures failed: {exc}")
            return
        self.show_summary(summary)

    def action_close(self) -> None:
        self.dismiss(None)
