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
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from tests.servers.http_front import Answer, Exchange, HttpFront, start_http_front

XML_ETAG = re.compile(rb"<ETag>((?:&#34;|&quot;|\")?)([0-9a-fA-F]{32})")


def kms_etag(real: str) -> str:
    """The ETag AWS would give: looks random, is not the MD5, stable per object."""
    return hashlib.md5(b"sse-kms:" + real.lower().encode()).hexdigest()


def _rewrite_header(value: str) -> str:
    return re.sub(r"[0-9a-fA-F]{32}", lambda m: kms_etag(m.group(0)), value, count=1)


@dataclass
class EtagProxy:
    upstream: str
    puts: Counter[str] = field(default_factory=Counter)  # object key -> PUTs seen
    _front: HttpFront | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def url(self) -> str:
        assert self._front is not None
        return self._front.url

    def count_put(self, key: str) -> None:
        with self._lock:
            self.puts[key] += 1

    def close(self) -> None:
        if self._front is not None:
            self._front.close()

    def _on_request(self, req: Exchange) -> None:
        if req.method == "PUT" and req.header("x-amz-copy-source") is None:
            path = urlsplit(req.path).path
            self.count_put(unquote(path.lstrip("/").partition("/")[2]))

    def _on_answer(self, req: Exchange, answer: Answer) -> None:
        if req.method != "HEAD" and b"<ETag>" in answer.body:
            answer.body = XML_ETAG.sub(lambda m: b"<ETag>" + m.group(1) +
                                       kms_etag(m.group(2).decode()).encode(), answer.body)
        answer.headers = [(k, _rewrite_header(v) if k.lower() == "etag" else v)
                          for k, v in answer.headers if k.lower() != "seaweed-x-amz-etag"]


def start_etag_proxy(upstream_url: str) -> EtagProxy:
    """Start the proxy on a free loopback port, in front of `upstream_url` (http only)."""
    proxy = EtagProxy(upstream=upstream_url)
    proxy._front = start_http_front(upstream_url, "etag-proxy", proxy._on_request,
                                    proxy._on_answer)
    return proxy
