"""What every screen is given to draw from (the fleet state, what was fetched, the time and
the theme), and the node bar at the top of a node's screens."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from rich.text import Text
from textual.message_pump import _MessagePumpMeta  # Screen's metaclass, to combine with ABC
from textual.screen import Screen
from textual.theme import Theme

from console.state import FleetState, NodeState
from console.tui.fetched import Fetched
from console.tui.widgets import figures as f
from console.tui.widgets.tones import LINK_TONE, style


@dataclass(slots=True)
class ViewContext:
    state: FleetState
    fetched: dict[str, Fetched]
    now: float
    theme: Theme
    read_only: bool = False


class _ViewMeta(abc.ABCMeta, _MessagePumpMeta):
    """Screens' own metaclass plus ABCMeta, so a view without show() cannot be made."""


class View(Screen[None], metaclass=_ViewMeta):
    """A screen the app redraws from state; `node_name` is the node it shows (None: fleet)."""

    node_name: str | None = None

    @abc.abstractmethod
    def show(self, ctx: ViewContext) -> None:
        """Render ctx's state; every concrete view defines it."""

    def forget(self) -> None:
        """Drop cached cells so the next show redraws everything (after a theme change)."""


def node_bar(ns: NodeState, ctx: ViewContext) -> Text:
    node = ns.node
    where = "local" if node.local else f"{node.user + '@' if node.user else ''}{node.host}" \
        + (f":{node.port}" if node.port else "")
    text = Text()
    text.append(f" {ns.name} ", style="bold reverse")
    text.append(f"  {node.role} · {where} · {node.run_dir}")
    snap = ns.snapshot
    if snap is not None and snap.agent_version:
        text.append(f" · agent {snap.agent_version}", style="dim")
    age = ns.age_s(ctx.now)
    link = ns.link if ns.link != "connected" else "live"
    text.append(f"   {link}", style=style(ctx.theme, LINK_TONE.get(ns.link, "good")))
    if age is not None:
        text.append(f" · last snapshot {f.age(age)} ago", style="dim")
    if ctx.read_only:
        text.append("   READ-ONLY", style=style(ctx.theme, "warn") + " bold")
    return text
