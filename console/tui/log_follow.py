"""The log pane's follow: while a node's screen shows its log tab and that log follows, a
`logs` call about once a second asks what the log gained since the last answer, over the
node's link (the one SSH channel it already has: no connection per call)."""

from __future__ import annotations

import time

from agents.rpc.protocol import RpcError
from console.tui.messages import LogFetched
from console.tui.port import ActionPort
from console.tui.screens.node import NodeView

FOLLOW_S = 1.0
CALL_TIMEOUT_S = 30.0


class LogFollower:
    def __init__(self, port: ActionPort) -> None:
        self.port = port
        self._asked: dict[str, float] = {}  # node -> when its last call went (monotonic)
        self._busy: set[str] = set()  # nodes with a call out: never two at once

    def due(self) -> tuple[str, str] | None:
        """(node, log) to ask now: the log shown, followed, on a connected node, last asked
        FOLLOW_S ago or more, with no call out."""
        screen = self.port.shown
        if not isinstance(screen, NodeView) or not screen.is_mounted \
                or screen.active_tab != "tab-log" or screen.node_name is None:
            return None
        node = screen.node_name
        view = self.port.fetched[node].log
        if view is None or not view.follow or view.log.next_from is None \
                or node in self._busy or self.port.connected_link(node) is None:
            return None
        if time.monotonic() - self._asked.get(node, 0.0) < FOLLOW_S:
            return None
        self._busy.add(node)  # taken now, before the worker starts
        self._asked[node] = time.monotonic()
        return node, view.log.name

    async def poll(self, node: str, name: str) -> None:
        """One call (after due() named it); its answer, or why following stops, as a
        message to the app."""
        try:
            params = self.port.fetched[node].log_view(name).log.params(0)
            try:
                reply = await self.port.call_node(node, "logs", params, CALL_TIMEOUT_S)
            except RpcError as exc:  # the log went, or the agent refuses it: say so once
                self.port.post_message(LogFetched(node, name, None, error=exc.message))
                return
            except (ConnectionError, TimeoutError, OSError):
                return  # the link reconnects (its state is on the node bar); asked again then
            self.port.post_message(LogFetched(node, name, reply))
        finally:
            self._busy.discard(node)
