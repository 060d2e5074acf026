"""The engine's HTTP client against servers that misbehave on the wire, each a real TCP server
in the test: every failure lands in its error class (connect, timeout, transport,
bad_response), and a body past MAX_RESPONSE_BYTES is refused while it arrives, announced or
chunked, not held in memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agents.engine.client import MAX_RESPONSE_BYTES, RequestFailed, chat, make_client, probe
from tests.servers.ports import free_ports

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
OK = (b'{"choices":[{"message":{"content":"x"},"finish_reason":"stop"}],'
      b'"usage":{"prompt_tokens":1,"completion_tokens":1}}')


async def _request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)


class Wire:
    def __init__(self) -> None:
        self.server: asyncio.Server | None = None

    async def serve(self, handler: Handler) -> str:
        async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await _request(reader)
                await handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(one, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    w = Wire()
    yield w
    if w.server is not None:
        w.server.close()
        await w.server.wait_closed()


async def _fails(url: str, read_timeout: float = 30.0) -> RequestFailed:
    client = make_client(url, 4, 2.0, read_timeout, None)
    try:
        with pytest.raises(RequestFailed) as err:
            await chat(client, BODY)
        return err.value
    finally:
        await client.aclose()


async def test_a_good_answer_parses(wire: Wire) -> None:
    async def good(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(OK)).encode() + b"\r\n\r\n" + OK)
        await w.drain()

    client = make_client(await wire.serve(good), 4, 2.0, 30.0, None)
    try:
        got = await chat(client, BODY)
        assert got.content == "x" and got.completion_tokens == 1
    finally:
        await client.aclose()


async def test_a_body_announced_past_the_cap_is_refused_unread(wire: Wire) -> None:
    sent = 0

    async def huge(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal sent
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(MAX_RESPONSE_BYTES * 4).encode()
                + b"\r\n\r\n")
        piece = b"x" * (1 << 20)
        while sent < MAX_RESPONSE_BYTES * 4:
            w.write(piece)
            await w.drain()
            sent += len(piece)

    err = await _fails(await wire.serve(huge))
    assert err.error == "bad_response" and "too large" in err.message and err.retryable
    assert sent < MAX_RESPONSE_BYTES * 4  # it was not read to the end


async def test_a_chunked_body_past_the_cap_is_refused_as_it_arrives(wire: Wire) -> None:
    async def endless(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"y" * (1 << 20)
        for _ in range(MAX_RESPONSE_BYTES // len(piece) * 2):
            w.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await w.drain()
        w.write(b"0\r\n\r\n")

    err = await _fails(await wire.serve(endless))
    assert err.error == "bad_response" and "too large" in err.message


async def test_a_connection_dropped_mid_body_is_a_transport_failure(wire: Wire) -> None:
    async def cut(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + OK[:20])
        await w.drain()

    err = await _fails(await wire.serve(cut))
    assert err.error == "transport" and err.server_fault and err.retryable


async def test_a_server_that_never_answers_is_a_timeout(wire: Wire) -> None:
    async def silent(r: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
        await r.read()  # until the client gives up and closes

    err = await _fails(await wire.serve(silent), read_timeout=0.5)
    assert err.error == "timeout" and err.server_fault


async def test_nothing_listening_is_a_connect_failure() -> None:
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    err = await _fails(url)
    assert err.error == "connect" and err.server_fault
    client = make_client(url, 4, 2.0, 30.0, None)
    try:
        assert not await probe(client, 1.0)
    finally:
        await client.aclose()


def _answer(body: bytes, *extra: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in extra)
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def test_one_connection_carries_request_after_request(wire: Wire) -> None:
    connections = requests = 0

    async def keep(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal connections, requests
        connections += 1
        while True:
            requests += 1
            w.write(_answer(OK))
            await w.drain()
            await _request(r)  # the next one on this connection, until the client closes

    client = make_client(await wire.serve(keep), 4, 2.0, 30.0, None)
    try:
        for _ in range(5):
            assert (await chat(client, BODY)).content == "x"
    finally:
        await client.aclose()
    assert (connections, requests) == (1, 5)


async def test_a_request_on_a_pooled_connection_the_server_closed_is_sent_again(
        wire: Wire) -> None:
    """uvicorn drops an idle keep-alive connection: a request written onto it as it closes
    never reached the server, and goes again on a new connection (not a server fault)."""
    connections = answered = 0

    async def drop_second(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal connections, answered
        connections += 1
        answered += 1
        w.write(_answer(OK))
        await w.drain()
        if connections == 1:
            await _request(r)  # read the second request, then close without a byte

    client = make_client(await wire.serve(drop_second), 4, 2.0, 30.0, None)
    try:
        assert (await chat(client, BODY)).content == "x"
        assert (await chat(client, BODY)).content == "x"
    finally:
        await client.aclose()
    assert (connections, answered) == (2, 2)


async def test_a_new_connection_closed_before_its_answer_is_not_sent_again(
        wire: Wire) -> None:
    connections = 0

    async def hang_up(_: asyncio.StreamReader, __: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1

    err = await _fails(await wire.serve(hang_up))
    assert err.error == "transport" and "before its answer" in err.message
    assert connections == 1  # the server may have read it: never sent twice


@pytest.mark.parametrize("shape", ["chunked", "to-close", "interim", "large"])
async def test_every_body_shape_a_server_or_proxy_sends_parses(wire: Wire, shape: str) -> None:
    big = b'{"pad":"' + b"p" * (8 << 20) + b'",' + OK[1:]  # 8 MiB, in many reads

    async def send(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if shape == "chunked":
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(OK), 7):
                w.write(f"{len(OK[i:i + 7]):x};ext=1\r\n".encode() + OK[i:i + 7] + b"\r\n")
                await w.drain()
            w.write(b"0\r\nX-Trailer: t\r\n\r\n")
        elif shape == "to-close":
            w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + OK)
        elif shape == "interim":
            w.write(b"HTTP/1.1 100 Continue\r\n\r\n" + _answer(OK))
        else:
            w.write(_answer(big))
        await w.drain()

    client = make_client(await wire.serve(send), 4, 2.0, 30.0, None)
    try:
        got = await chat(client, BODY)
        assert got.content == "x" and got.completion_tokens == 1
    finally:
        await client.aclose()


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n",
                                  b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nX: " + b"h" * (128 << 10)])
async def test_an_answer_that_is_not_http_we_read_is_a_transport_failure(
        wire: Wire, head: bytes) -> None:
    async def odd(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(head)
        await w.drain()
        await r.read()  # hold the connection open: the client must not wait for a close

    err = await _fails(await wire.serve(odd), read_timeout=20)
    assert err.error == "transport", err.message
