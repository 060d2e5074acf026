"""A pushed status snapshot is decoded once, typed, from its bytes (console/transport.py
`status_snapshot`, console/state.py), and the same bytes again are not decoded at all; every
other line is read the general way."""

from __future__ import annotations

import msgspec

from agents.rpc.protocol import notification
from agents.rundir.schema import Snapshot
from console.state import FleetState
from console.transport import status_snapshot
from tests.console import data as d


def test_a_status_line_gives_its_snapshot_bytes_and_any_other_line_none() -> None:
    snap = d.generate_snapshot()
    line = notification("status", snap) + b"\n"
    got = status_snapshot(line)
    assert got is not None and msgspec.json.decode(got) == msgspec.json.decode(
        msgspec.json.encode(snap))
    spaced = b'{ "params": {"kind": "generate"}, "method": "status", "jsonrpc": "2.0" }'
    assert status_snapshot(spaced) == b'{"kind": "generate"}'
    assert status_snapshot(b'{"jsonrpc":"2.0","method":"status"}') == b"{}"
    for other in (b'{"jsonrpc":"2.0","id":3,"result":{"ok":true}}',
                  b'{"jsonrpc":"2.0","id":3,"method":"status","params":{}}',
                  b'{"jsonrpc":"2.0","method":"alert","params":{}}',
                  b'{"jsonrpc":"2.0","method":7}', b"Welcome to gpu-box-7", b"[1, 2]", b""):
        assert status_snapshot(other) is None, other


def test_the_same_bytes_again_are_not_decoded_but_count_as_contact() -> None:
    now = [d.NOW]
    state = FleetState(d.fleet(), clock=lambda: now[0])
    raw = msgspec.json.encode(d.generate_snapshot())
    first = state.apply("gen-1", raw)
    assert isinstance(first, Snapshot)
    version = state.version
    now[0] += 1.0
    again = state.apply("gen-1", bytes(raw))  # equal bytes, another object
    assert again is first
    assert state.nodes["gen-1"].received_at == now[0] and state.version == version + 1
    changed = state.apply("gen-1", msgspec.json.encode(d.generate_snapshot(run="other")))
    assert changed is not None and changed is not first and changed.run == "other"
    # An unreadable snapshot keeps the last good one on screen; the next good one is read.
    assert state.apply("gen-1", b'{"kind": 5}') is None
    assert state.nodes["gen-1"].snapshot is changed
    assert "unreadable snapshot" in (state.nodes["gen-1"].error or "")
    assert state.apply("gen-1", raw) is not None
    assert state.nodes["gen-1"].snapshot.run == first.run  # type: ignore[union-attr]
