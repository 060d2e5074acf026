"""The unknown-host-key question: the node's fingerprint, to compare with what the node's
owner says, and an explicit yes. A changed key is never offered here (it is an error)."""

from __future__ import annotations

from console.tui.widgets.confirm import ConfirmModal


class HostKeyModal(ConfirmModal):
    def __init__(self, node: str, host: str, fingerprint: str | None, known_hosts: str) -> None:
        super().__init__(
            f"Trust the host key of {node} ({host})?",
            f"The node's host key is not in {known_hosts}.\n\n"
            f"  fingerprint  {fingerprint or 'unknown (the node did not send it)'}\n\n"
            "Compare it with the one the node's owner gives you. Yes adds it to known_hosts "
            "and connects; no leaves the node unconnected.",
            danger=False)
