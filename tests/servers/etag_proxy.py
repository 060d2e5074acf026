"""A loopback HTTP proxy in front of a real S3 server that answers ETags as AWS does for
objects under SSE-KMS: a 32-hex value that is not the MD5 of the bytes. SeaweedFS's own
SSE-KMS keeps ETag = MD5, so this is what shows code that still leans on it.

Every request goes to the real server unchanged (Host included, so SigV4 signatures hold);
only ETags in the answer (headers and XML bodies) are rewritten, the same way for the same
object, so a HEAD and a listing agree. It also counts the PUTs of each key: the uploads a
client made, as the server saw them.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-connection", "expect"}
XML_ETAG = re.compile(rb"<ETag>((?:&#34;|&quot;|\")?)([0-9a-fA-F]{32})")


def kms_etag(real: str) -> str:
    """The ETag AWS would give: looks random, is not the MD5, stable per object."""
    return hashlib.md5(b"sse-kms:" + real.lower().encode()).hexdigest()


def _rewrite_header(value: str) -> str:
    return re.sub(r"[0-9a-fA-F]{32}", lambda m: kms_etag(m.group(0)), value, count=1)


@dataclass
class EtagProxy:
    url: str
    upstream: str
    puts: Counter[str] = field(default_factory=Counter)  # object key -> PUTs seen
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_put(self, key: str) -> None:
        with self._lock:
            self.puts[key] += 1

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def start_etag_proxy(upstream_url: str) -> EtagProxy:
    """Start the proxy on a free loopback port, in front of `upstream_url` (http only)."""
    up = urlsplit(upstream_url)
    assert up.scheme == "http" and up.hostname and up.port, upstream_url
    host, port = up.hostname, up.port

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as botocore expects

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                self.send_error(501, "chunked request bodies are not proxied")
                return
            body = self.rfile.read(length) if length else b""
            path = urlsplit(self.path).path
            if self.command == "PUT" and "x-amz-copy-source" not in self.headers:
                proxy.count_put(unquote(path.lstrip("/").partition("/")[2]))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn = http.client.HTTPConnection(host, port, timeout=60)
            try:
                conn.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)
                for k, v in headers.items():
                    conn.putheader(k, v)
                if "content-length" not in {k.lower() for k in headers}:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                resp = conn.getresponse()
                data = resp.read()
                answer = resp.getheaders()
                status, reason = resp.status, resp.reason
            finally:
                conn.close()
            if self.command != "HEAD" and b"<ETag>" in data:
                data = XML_ETAG.sub(lambda m: b"<ETag>" + m.group(1) +
                                    kms_etag(m.group(2).decode()).encode(), data)
            self.send_response(status, reason)
            for k, v in answer:
                low = k.lower()
                if low in HOP_BY_HOP or low == "seaweed-x-amz-etag":
                    continue
                if low == "content-length":
                    v = v if self.command == "HEAD" else str(len(data))
                elif low == "etag":
                    v = _rewrite_header(v)
                self.send_header(k, v)
            if self.command != "HEAD" and "content-length" not in {k.lower() for k, _ in answer}:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    proxy = EtagProxy(url=f"http://127.0.0.1:{server.server_address[1]}",
                      upstream=upstream_url, _server=server)
    threading.Thread(target=server.serve_forever, name="etag-proxy", daemon=True).start()
    return proxy
