"""What the TUI's parts may ask of the app, as narrow Protocols: the action handlers
(`ActionPort`: the fleet state, a call to a node, a question, a screen, a notification, the
terminal lent to a shell) and the
command palette (`PalettePort`). FleetdeckApp provides both; nothing below it imports the app,
so a handler gets what it needs and no more."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen

from console.fleet import Fleet
from console.state import FleetState
from console.transport import AgentLink
from console.tui.fetched import Fetched

if TYPE_CHECKING:  # the node screens offer the palette, which takes this port
    from console.tui.screens.node import NodeView

AnswerT = TypeVar("AnswerT")


class ActionPort(Protocol):
    """The app as the action handlers see it."""

    fleet: Fleet
    state: FleetState
    fetched: dict[str, Fetched]
    clock: Callable[[], float]  # the time ages on screen are computed from

    @property
    def shown(self) -> Screen[Any] | None:
        """The screen shown now (a node's, the fleet, a modal); None while the app starts or
        closes."""

    def current_node(self) -> str | None:
        """The node an action applies to: the one shown, or the fleet table's cursor row."""

    def current_campaign(self) -> str | None:
        """The campaign an action applies to (to each of its nodes): the one shown, or the
        fleet table's cursor on a campaign's row; None when a node is the target."""

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast."""

    def report(self, node: str, text: str, ok: bool = True) -> None:
        """An action's outcome, as a notification naming the node."""

    async def call_node(self, name: str, method: str, params: dict[str, Any],
                        timeout: float = 60.0) -> Any:
        """The agent's result; raises RpcError, ConnectionError, TimeoutError or OSError."""

    def connected_link(self, name: str) -> AgentLink | None:
        """The node's link while it is connected, else None."""

    async def ask(self, modal: ModalScreen[AnswerT]) -> AnswerT:
        """Show a question and wait for its answer (from a worker)."""

    async def open_screen(self, screen: Screen[Any]) -> None:
        """Push a screen over the current one."""

    async def show_node(self, name: str) -> NodeView:
        """The node's screen, opened if another is shown."""

    async def lend_terminal(self, argv: list[str], cwd: str | None = None,
                            held: Callable[[int], str | None] = lambda _code: None) -> int:
        """Run argv on the terminal, the TUI suspended, until it exits; its exit status.
        Raises textual.app.SuspendNotSupported (no terminal to lend) or OSError."""

    def post_message(self, message: Message) -> bool:
        """Hand fetched data to the app, which keeps it and redraws."""


@runtime_checkable
class PalettePort(Protocol):
    """The app as the command palette sees it."""

    read_only: bool

    def key_for(self, action_id: str) -> str:
        """The key the action is on now (the user's keymap applied)."""

    async def perform(self, action_id: str) -> None:
        """Run a registry action as its key would."""

    def use_theme(self, name: str) -> None:
        """Switch the colour theme."""
