"""The latest completions (the `samples` RPC), readable: finish reason, tokens, the start of
the reasoning and of the answer. Looking at the data with one's own eyes catches what counters
miss (a dataset of empty answers)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.sanitize import shown
from console.tui.widgets import figures as f


def sample_text(s: dict[str, Any]) -> Group:
    head = Text()
    head.append(f"#{s.get('index')}", style="bold")
    finish = s.get("finish_reason")
    head.append(f"  {finish}", style="bold yellow" if finish == "length" else "")
    head.append(f"  {f.num(s.get('completion_tokens'))} tokens "
                f"(reasoning {f.num(s.get('reasoning_tokens'))})")
    if s.get("server") is not None:
        head.append(f"  server {s['server']}")
    if (s.get("attempt") or 1) > 1:
        head.append(f"  attempt {s['attempt']}", style="italic")
    if s.get("tool_calls"):
        head.append(f"  {s['tool_calls']} tool call(s)")
    body = Table.grid(padding=(0, 1))
    body.add_column(width=9, style="bold")  # wrapped text stays in its own column
    body.add_column(ratio=1)
    # A model's text, from the node: its control characters shown escaped.
    reasoning = shown((s.get("reasoning_head") or "").strip(), multiline=True)
    content = shown((s.get("content_head") or "").strip(), multiline=True)
    if reasoning:
        body.add_row("thinking", Text(reasoning, style="dim italic"))
    if content:
        body.add_row("answer", Text(content))
    elif s.get("tool_calls"):
        body.add_row("answer", Text("(a tool call, no text)", style="dim"))
    else:
        body.add_row("answer", Text("(empty)", style="bold red"))
    return Group(head, Padding(body, (0, 0, 1, 2)))


class SamplesPane(VerticalScroll):
    def __init__(self, key: str, **kwargs: Any) -> None:
        """`key`: the key of the `samples` action, for the hint."""
        super().__init__(**kwargs)
        self.key = key

    def compose(self) -> ComposeResult:
        yield Static(f"press {self.key} to read the latest completions", id="samples-body")

    def show(self, samples: list[dict[str, Any]]) -> None:
        body = self.query_one("#samples-body", Static)
        if not samples:
            body.update(Text("no completions yet", style="dim"))
            return
        body.update(Group(*(sample_text(s) for s in samples)))
