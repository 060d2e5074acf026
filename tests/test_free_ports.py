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


def test_a_port_drawn_by_one_process_is_not_drawn_by_another_before_it_binds() -> None:
    """Two processes (four test workers, two runs side by side) drawing at once: a port one
    has drawn and not bound yet is never the other's, nor a block's, and all are below the
    ephemeral range."""
    import subprocess
    import sys

    from console.localproc import port_block

    code = ("import json; from console.localproc import free_ports; "
            "print(json.dumps(free_ports(300)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=120)
    theirs = set(__import__("json").loads(other.stdout))  # drawn, never bound
    mine = set(free_ports(300))
    assert len(theirs) == len(mine) == 300 and not theirs & mine
    assert max(theirs | mine) < _ephemeral_start()
    for _ in range(20):
        base = port_block(4)
        assert not set(range(base, base + 4)) & (theirs | mine)


def test_a_seaweedfs_start_whose_port_another_program_took_goes_again_on_new_ports(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Another program binds one of the ten ports between the draw and SeaweedFS's own bind:
    SeaweedFS exits at start, and start_s3 draws again (what it said is in the error when it
    cannot start at all)."""
    import console.seaweed as seaweed

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", free_ports(1)[0]))
    squatter.listen()
    draws: list[list[int]] = []

    def draw(n: int) -> list[int]:
        ports = free_ports(n)
        if not draws:
            ports[seaweed.PORT_FLAGS.index("s3.port")] = squatter.getsockname()[1]
        draws.append(ports)
        return ports

    monkeypatch.setattr(seaweed, "free_ports", draw)
    try:
        server = seaweed.start_s3(tmp_path / "s3")
        try:
            assert len(draws) == 2 and server.ports == dict(zip(seaweed.PORT_FLAGS, draws[1],
                                                                strict=True))
            server.client().put_object(Bucket=server.bucket, Key="k", Body=b"v")
        finally:
            server.kill()
        assert "is not available" in (tmp_path / "s3" / "weed.out").read_text()
    finally:
        squatter.close()
