"""A loopback HTTP proxy in front of one upstream server, for the test fronts that change what
passes (etag_proxy.py, lax_s3.py): each request and each answer goes through its owner's hook.

Requests go to the upstream as they came, Host included (SigV4 signs it), less the hop-by-hop
headers; answers come back whole, with their Content-Length recounted.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-connection", "expect"}
UPSTREAM_TIMEOUT_S = 60.0


class Refuse(Exception):
    """Raised by a request hook: answer the client with this status, forward nothing."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Exchange:
    """One request as the front forwards it; a request hook may change any of it."""

    method: str
    path: str  # the request target as sent: path and query, still percent-encoded
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def drop(self, *names: str) -> list[tuple[str, str]]:
        """Remove these headers (any case); return what was removed."""
        low = {n.lower() for n in names}
        gone = [(k, v) for k, v in self.headers if k.lower() in low]
        self.headers = [(k, v) for k, v in self.headers if k.lower() not in low]
        return gone


@dataclass
class Answer:
    """The upstream's answer, read whole; an answer hook may change any of it."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


RequestHook = Callable[[Exchange], None]
AnswerHook = Callable[[Exchange, Answer], None]


@dataclass
class HttpFront:
    url: str
    upstream: str
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def start_http_front(upstream_url: str, name: str, on_request: RequestHook | None = None,
                     on_answer: AnswerHook | None = None) -> HttpFront:
    """Start a front on a free loopback port, in front of `upstream_url` (http only)."""
    up = urlsplit(upstream_url)
    assert up.scheme == "http" and up.hostname and up.port, upstream_url
    host, port = up.hostname, up.port

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as botocore expects

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                self.send_error(501, "chunked request bodies are not proxied")
                return
            length = int(self.headers.get("Content-Length") or 0)
            req = Exchange(self.command, self.path,
                           [(k, v) for k, v in self.headers.items()
                            if k.lower() not in HOP_BY_HOP],
                           self.rfile.read(length) if length else b"")
            try:
                if on_request is not None:
                    on_request(req)
            except Refuse as refused:
                self.send_error(refused.status, str(refused))
                return
            answer = _send(host, port, req)
            if on_answer is not None:
                on_answer(req, answer)
            head = self.command == "HEAD"
            self.send_response(answer.status, answer.reason)
            counted = False
            for k, v in answer.headers:
                if k.lower() == "content-length":
                    counted = True
                    v = v if head else str(len(answer.body))
                self.send_header(k, v)
            if not head and not counted:
                self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            if not head:
                self.wfile.write(answer.body)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    front = HttpFront(url=f"http://127.0.0.1:{server.server_address[1]}",
                      upstream=upstream_url, _server=server)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return front


def _send(host: str, port: int, req: Exchange) -> Answer:
    conn = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_S)
    try:
        conn.putrequest(req.method, req.path, skip_host=True, skip_accept_encoding=True)
        for k, v in req.headers:
            conn.putheader(k, v)
        if req.header("Content-Length") is None:
            conn.putheader("Content-Length", str(len(req.body)))
        conn.endheaders(req.body)
        resp = conn.getresponse()
        body = resp.read()
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
        return Answer(resp.status, resp.reason, headers, body)
    finally:
        conn.close()
