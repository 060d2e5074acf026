"""The engine's HTTP/1.1 client: a keep-alive pool per server on asyncio protocols, sending a
request in one write and parsing the answer as it arrives, no more than the engine needs.

Why not aiohttp: per completion it cost the engine more CPU than everything else the engine
does (its request object, tracing, cookie and redirect machinery, per-request timeout objects;
benchmarks/dispatch.py measured a bare asyncio + aiohttp loop at 0.4 ms of CPU per
completion, of which this module's path is a fraction). What an SGLang server (uvicorn) sends
is a small subset of HTTP/1.1: a status line, headers, a body with a Content-Length (chunked
or close-delimited in some proxies and error pages, both handled). Anything else is a
`TransportError`.

Failures: `ConnectFailed` (nothing listening, refused, unreachable), `TimeoutError` (connect,
or no byte for the read timeout), `ResponseTooLarge` (announced or arriving past the cap,
refused before it is held), `TransportError` (the connection dropped mid-answer, a malformed
answer). A request written onto a pooled connection the server closed before it read a byte
(uvicorn drops an idle keep-alive connection after 5 s; pooled ones are dropped at
KEEPALIVE_S, but a close may cross a send) is sent once more on a new connection: it never
reached the server."""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

# The most a response body may hold: a chat completion of the largest max_tokens is well under
# a megabyte; a server (or something in front of one) sending more is broken, and the engine's
# memory is not its to fill.
MAX_RESPONSE_BYTES = 32 << 20
MAX_HEAD_BYTES = 64 << 10  # a status line and headers longer than this are not a server's
# Idle pooled connections are dropped before the server drops them: uvicorn (SGLang's HTTP
# server) closes an idle keep-alive connection after 5 s.
KEEPALIVE_S = 4.0
USER_AGENT = "fleetdeck"


class TransportError(Exception):
    """The connection failed mid-request, or the answer was not HTTP/1.1 we can read."""


class ConnectFailed(TransportError):
    """No connection could be made (refused, unreachable, no such host)."""


class ResponseTooLarge(TransportError):
    pass


class _Stale(TransportError):
    """A pooled connection closed before a byte of the answer came: the server never read
    the request."""


def _header_value(value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError("an HTTP header value holds a line break")
    return value


class _Conn(asyncio.Protocol):
    """One connection and the answer it is reading. One request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 on_lost: Callable[[_Conn], None]) -> None:
        self.loop = loop
        self._on_lost = on_lost
        self._timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.last_rx = 0.0
        self._waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._buf = bytearray()  # grows in place: a large answer is not copied per read
        self._got_bytes = False
        self._status = 0
        self._keep = True
        self._mode = 0  # 0: headers still to come; 1: Content-Length; 2: chunked; 3: to EOF
        self._length = 0
        self._chunks: list[bytes] = []
        self._size = 0

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted again
            return
        self.last_rx = self.loop.time()
        self._got_bytes = True
        self._buf += data
        try:
            self._parse()
        except TransportError as exc:
            self._fail(exc)
            self.close()

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._on_lost(self)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._mode == 3:  # a close-delimited body ends with the connection
            try:
                self._done(bytes(self._size_checked(self._buf)), keep=False)
            except ResponseTooLarge as too_large:
                waiter.set_exception(too_large)
        elif not self._got_bytes and self.reused:
            waiter.set_exception(_Stale("the pooled connection was closed"))
        else:
            why = f": {exc}" if exc else ""
            what = "before its answer" if not self._got_bytes else "mid-answer"
            waiter.set_exception(TransportError(f"the server closed the connection {what}{why}"))

    # -- the request --------------------------------------------------------------------------

    async def roundtrip(self, request: bytes, read_timeout: float) -> tuple[int, bytes, bool]:
        """(status, body, keep-alive) of one request."""
        assert self.transport is not None
        waiter: asyncio.Future[tuple[int, bytes, bool]] = self.loop.create_future()
        self._waiter = waiter
        self._buf, self._got_bytes, self._mode, self._chunks, self._size = \
            bytearray(), False, 0, [], 0
        self.last_rx = self.loop.time()
        self._timer = self.loop.call_later(read_timeout, self._timed_out, read_timeout)
        self.transport.write(request)
        try:
            return await waiter
        except BaseException:
            self.close()  # a cancelled or failed request leaves the connection unusable
            raise
        finally:
            self._timer.cancel()
            self._waiter = None

    def _timed_out(self, read_timeout: float) -> None:
        """No byte for `read_timeout` fails the request; a byte since: look again later (one
        timer a request, not one per byte)."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        quiet = self.loop.time() - self.last_rx
        if quiet >= read_timeout - 0.001:
            waiter.set_exception(TimeoutError(f"no answer for {read_timeout:g} s"))
            self.close()
        else:
            self._timer = self.loop.call_later(read_timeout - quiet, self._timed_out,
                                                      read_timeout)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- parsing ------------------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def _done(self, body: bytes, keep: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result((self._status, body, keep and self._keep))

    def _size_checked(self, body: bytearray) -> bytearray:
        if len(body) > MAX_RESPONSE_BYTES:
            raise ResponseTooLarge(f"over {MAX_RESPONSE_BYTES:,} bytes")
        return body

    def _parse(self) -> None:
        while self._mode == 0:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise TransportError(f"response headers over {MAX_HEAD_BYTES:,} bytes")
                return
            head = bytes(self._buf[:end])
            del self._buf[:end + 4]
            self._head(head)
        if self._mode == 1:
            if len(self._buf) >= self._length:
                body, rest = bytes(self._buf[:self._length]), len(self._buf) > self._length
                self._buf = bytearray()
                self._done(body, keep=not rest)  # bytes past the body: not reused
        elif self._mode == 2:
            self._chunked()
        elif self._mode == 3:
            self._size_checked(self._buf)

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise TransportError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self._status = status
        self._keep = parts[0] == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise TransportError(f"a malformed header line: {line[:80]!r}")
            name = name.strip().lower()
            if name == b"content-length":
                value = value.strip()
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise TransportError(f"a bad Content-Length: {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                codings = [c.strip() for c in value.lower().split(b",")]
                if codings[-1:] != [b"chunked"] or len(codings) > 1:
                    raise TransportError(f"an unsupported Transfer-Encoding: {value[:40]!r}")
                chunked = True
            elif name == b"connection":
                tokens = {t.strip() for t in value.lower().split(b",")}
                if b"close" in tokens:
                    self._keep = False
                elif b"keep-alive" in tokens:
                    self._keep = True
        if chunked:
            self._mode = 2  # chunked wins over a length (RFC 9112 6.3), and is not reused...
            if length is not None:
                self._keep = False  # ...as a message with both may be a smuggling attempt
        elif length is not None:
            if length > MAX_RESPONSE_BYTES:
                raise ResponseTooLarge(f"{length:,} bytes announced")
            self._mode, self._length = 1, length
        elif status in (204, 304):
            self._mode, self._length = 1, 0
        else:
            self._mode, self._keep = 3, False

    def _chunked(self) -> None:
        buf = self._buf
        pos = 0
        while True:
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                if len(buf) - pos > 1024:
                    raise TransportError("a chunk size line over 1 KiB")
                break
            size_text = buf[pos:line_end].split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise TransportError(f"a bad chunk size: {size_text[:20]!r}") from None
            if size == 0:  # the last chunk; then trailer lines, if any, and an empty line
                rest = line_end + 2
                if buf.startswith(b"\r\n", rest):
                    end = rest + 2
                else:
                    end = buf.find(b"\r\n\r\n", rest) + 4
                    if end < 4:
                        if len(buf) - rest > MAX_HEAD_BYTES:
                            raise TransportError(f"trailers over {MAX_HEAD_BYTES:,} bytes")
                        break
                self._done(b"".join(self._chunks), keep=end == len(buf))
                self._buf = bytearray()
                return
            if self._size + size > MAX_RESPONSE_BYTES:
                raise ResponseTooLarge(f"over {MAX_RESPONSE_BYTES:,} bytes")
            data_start = line_end + 2
            if len(buf) < data_start + size + 2:
                break
            if buf[data_start + size:data_start + size + 2] != b"\r\n":
                raise TransportError("a chunk not ended by CRLF")
            self._chunks.append(bytes(buf[data_start:data_start + size]))
            self._size += size
            pos = data_start + size + 2
        if pos:
            del buf[:pos]  # in place: a chunk still arriving is not copied per read


class Pool:
    """One server's connections: at most `limit` busy at once (more wait), idle ones reused
    newest first and dropped after KEEPALIVE_S."""

    def __init__(self, url: str, limit: int, connect_timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.base = parts.path.rstrip("/")
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default else f"{host}:{self.port}"
        self.limit = limit
        self.connect_timeout = connect_timeout
        self._idle: dict[_Conn, None] = {}  # insertion-ordered: popitem() takes the newest
        self._busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self._all: set[_Conn] = set()
        self._addr: str | None = None  # the host's address, resolved once

    def head(self, method: str, path: str, headers: dict[str, str], length: int | None) -> bytes:
        lines = [f"{method} {self.base}{path} HTTP/1.1", f"Host: {self.host_header}",
                 f"User-Agent: {USER_AGENT}"]
        lines += [f"{_header_value(k)}: {_header_value(v)}" for k, v in headers.items()]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def request(self, request: bytes, read_timeout: float,
                      connect_timeout: float) -> tuple[int, bytes]:
        for again in (True, False):
            conn = await self._take(connect_timeout)
            keep = False
            try:
                status, body, keep = await conn.roundtrip(request, read_timeout)
                return status, body
            except _Stale:
                if not again:
                    raise TransportError("the server closed the connection before its "
                                         "answer, twice") from None
            finally:
                self._give(conn, keep)
        raise AssertionError("unreachable")

    async def _take(self, connect_timeout: float) -> _Conn:
        if self._closed:
            raise RuntimeError("the client is closed")
        while self._busy >= self.limit:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._wake()  # our turn came with the cancel: pass it on
                else:
                    self._waiters.remove(fut)
                raise
        self._busy += 1
        try:
            loop = asyncio.get_running_loop()
            now = loop.time()
            while self._idle:
                conn, _ = self._idle.popitem()
                if conn.closed:
                    continue
                if now - conn.idle_since > KEEPALIVE_S:
                    conn.close()
                    continue
                conn.reused = True
                return conn
            return await self._connect(loop, connect_timeout)
        except BaseException:
            self._busy -= 1
            self._wake()
            raise

    async def _connect(self, loop: asyncio.AbstractEventLoop, timeout: float) -> _Conn:
        ssl: Any = None
        if self.tls:
            import ssl as ssl_module
            ssl = ssl_module.create_default_context()
        try:
            async with asyncio.timeout(timeout):
                if self._addr is None:
                    infos = await loop.getaddrinfo(self.host, self.port,
                                                   type=socket.SOCK_STREAM)
                    if not infos:
                        raise OSError(f"{self.host} has no address")
                    self._addr = str(infos[0][4][0])
                _, conn = await loop.create_connection(
                    lambda: _Conn(loop, self._lost), self._addr, self.port, ssl=ssl,
                    server_hostname=self.host if ssl is not None else None)
        except TimeoutError:
            raise TimeoutError(f"no connection to {self.host}:{self.port} in {timeout:g} s") \
                from None
        except OSError as exc:
            self._addr = None  # resolved again next time: the host may have moved
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: "
                                f"{exc.strerror or exc}") from None
        self._all.add(conn)
        return conn

    def _give(self, conn: _Conn, keep: bool) -> None:
        self._busy -= 1
        if keep and not conn.closed and not self._closed:
            conn.idle_since = conn.loop.time()
            self._idle[conn] = None
        else:
            conn.close()
            self._all.discard(conn)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _lost(self, conn: _Conn) -> None:
        self._idle.pop(conn, None)
        self._all.discard(conn)

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports' close callbacks run
