"""The fleet as the console knows it: per node, the link's state, the last snapshot and its
age, and which alerts are new. Widgets render this; they never ask a node anything. Times come
from the one clock the owner injects (the TUI's, frozen in tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agents.rundir.schema import Alert, Snapshot
from console.fleet import Fleet, Node
from console.linkstate import LinkState

_decoder = msgspec.json.Decoder(Snapshot)


@dataclass(slots=True)
class NodeState:
    node: Node
    link: LinkState = "connecting"
    error: str | None = None
    snapshot: Snapshot | None = None
    received_at: float | None = None
    alert_codes: set[str] = field(default_factory=set)
    raw: bytes | None = None  # the pushed bytes the snapshot was decoded from

    @property
    def name(self) -> str:
        return self.node.name

    def age_s(self, now: float) -> float | None:
        """Seconds since the last snapshot, by the same clock that stamped it."""
        if self.received_at is None:
            return None
        return max(0.0, now - self.received_at)


class FleetState:
    """Applies snapshots (decoded once, typed) and tells listeners what changed."""

    def __init__(self, fleet: Fleet, on_new_alert: Callable[[str, Alert], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.fleet = fleet
        self.clock = clock  # stamps each snapshot's arrival; ages are measured against it
        self.nodes: dict[str, NodeState] = {n.name: NodeState(n) for n in fleet.nodes}
        self.on_new_alert = on_new_alert
        self.version = 0  # bumped on every change, for cheap redraw checks
        # Per campaign: the nodes whose given-back record its queue holds (queue_status).
        self.given_back: dict[str, set[str]] = {}

    def apply(self, name: str, raw: dict[str, Any] | bytes) -> Snapshot | None:
        state = self.nodes.get(name)
        if state is None:
            return None
        if isinstance(raw, bytes) and state.snapshot is not None and raw == state.raw:
            state.received_at = self.clock()  # the same snapshot again: fresh, not decoded
            self.version += 1
            return state.snapshot
        state.raw = raw if isinstance(raw, bytes) else None
        try:
            snap = (_decoder.decode(raw) if isinstance(raw, bytes)
                    else msgspec.convert(raw, Snapshot))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            state.error = f"unreadable snapshot: {exc}"
            state.raw = None
            self.version += 1
            return None
        state.snapshot = snap
        state.received_at = self.clock()
        codes = {a.code for a in snap.alerts}
        if self.on_new_alert is not None:
            for alert in snap.alerts:
                if alert.code not in state.alert_codes:
                    self.on_new_alert(name, alert)
        state.alert_codes = codes
        self.version += 1
        return snap

    def set_link(self, name: str, link: LinkState, error: str | None) -> None:
        state = self.nodes.get(name)
        if state is None:
            return
        state.link, state.error = link, error
        self.version += 1

    def names(self) -> list[str]:
        return list(self.nodes)
