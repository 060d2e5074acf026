"""A loopback TCP front for one node's view of a server, which a test can cut off: blackhole()
is a network partition as that node sees it (bytes stop both ways, new connections are taken
but never answered: timeouts, never refusals), restore() ends it.

It passes bytes unchanged, so HTTP Host headers, SigV4 signatures and TLS all hold: a client
signs for the front's URL and the server checks against the Host header it receives.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

CHUNK = 65536
CONNECT_TIMEOUT_S = 30.0


@dataclass(eq=False)
class _Link:
    """One client connection and, once it is made, its upstream connection."""

    client: socket.socket
    upstream: socket.socket | None = None
    closed: bool = False
    ended: int = 0  # directions that ended cleanly

    def close(self) -> None:
        self.closed = True
        for s in (self.client, self.upstream):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv on it
                except OSError:
                    pass
                s.close()


@dataclass
class TcpFront:
    url: str
    upstream: str
    _listener: socket.socket = field(repr=False)
    _links: set[_Link] = field(default_factory=set, repr=False)
    _blackholed: bool = False
    _closed: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def blackhole(self) -> None:
        """From now on no byte passes either way, on open connections or new ones."""
        with self._cond:
            self._blackholed = True

    def restore(self) -> None:
        """Pass bytes again. Every connection open now lived through the blackhole, and is
        dropped, as TCP gives up after a long partition: nothing held is delivered late, and
        a pooled client opens fresh connections. Without a blackhole, nothing changes."""
        with self._cond:
            if not self._blackholed:
                return
            self._drop_links()
            self._blackholed = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._drop_links()
            self._cond.notify_all()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
        except OSError:
            pass
        self._listener.close()

    def _drop_links(self) -> None:
        for link in self._links:
            link.close()
        self._links.clear()

    def _passing(self, link: _Link) -> bool:
        """Wait out a blackhole; False once the link is dropped."""
        with self._cond:
            while self._blackholed and not link.closed:
                self._cond.wait()
            return not link.closed

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            link = _Link(client)
            with self._cond:
                if self._closed:
                    link.close()
                    return
                self._links.add(link)
            threading.Thread(target=self._serve, args=(link,), name="tcp-front-link",
                             daemon=True).start()

    def _serve(self, link: _Link) -> None:
        if not self._passing(link):
            return
        up = urlsplit(self.upstream)
        assert up.hostname and up.port
        try:
            upstream = socket.create_connection((up.hostname, up.port), CONNECT_TIMEOUT_S)
        except OSError:
            self._forget(link)
            return
        upstream.settimeout(None)
        with self._cond:
            if link.closed:
                upstream.close()
                return
            link.upstream = upstream
        threading.Thread(target=self._pump, args=(link, upstream, link.client),
                         name="tcp-front-down", daemon=True).start()
        self._pump(link, link.client, upstream)

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not self._passing(link):
                    return  # held through a blackhole: dropped with the link, never sent
                if not data:
                    break
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)  # pass the end on; the other way may still run
        except OSError:
            self._forget(link)
            return
        with self._cond:
            link.ended += 1
            if link.ended < 2:
                return
        self._forget(link)

    def _forget(self, link: _Link) -> None:
        with self._cond:
            self._links.discard(link)
        link.close()


def start_tcp_front(upstream_url: str) -> TcpFront:
    """Start a front on a free loopback port, in front of `upstream_url`'s host and port;
    its `url` has the upstream's scheme."""
    up = urlsplit(upstream_url)
    assert up.hostname and up.port, upstream_url
    listener = socket.create_server(("127.0.0.1", 0))
    front = TcpFront(url=f"{up.scheme}://127.0.0.1:{listener.getsockname()[1]}",
                     upstream=upstream_url, _listener=listener)
    threading.Thread(target=front._accept, name="tcp-front", daemon=True).start()
    return front
