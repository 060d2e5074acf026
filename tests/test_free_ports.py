"""Loopback ports for servers the tests and the demo start: distinct, free, and never from
the kernel's ephemeral range, where any outgoing connection could take one before a server
that binds late (SGLang and the simulator bind after loading) gets to it."""

from __future__ import annotations

import socket

from console.localproc import _ephemeral_start, free_ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert all(10_000 <= p < _ephemeral_start() for p in ports), ports
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_never_handed_out() -> None:
    held = []
    try:
        for p in free_ports(200):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            s.listen()
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        assert not taken & set(free_ports(200))
    finally:
        for s in held:
            s.close()


def test_a_block_of_ports_is_free_consecutive_and_below_the_ephemeral_range() -> None:
    from console.localproc import port_block

    for n in (1, 2, 8):
        base = port_block(n)
        assert base >= 10_000 and base + n <= _ephemeral_start()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
        finally:
            for s in socks:
                s.close()
