"""The states of a node's agent link, named once: the transport sets them, the fleet state
keeps them, the widgets colour them. Plain strings, so `--json` and messages carry them as is."""

from __future__ import annotations

from typing import Literal, get_args

LinkState = Literal["connecting", "connected", "reconnecting", "unreachable", "host key",
                    "version mismatch"]
LINK_STATES: tuple[LinkState, ...] = get_args(LinkState)
