"""A loopback front for a real S3 server that acts like an S3-compatible store that ignores
conditional writes: it never answers 412, so a second `If-None-Match: *` create, or an
`If-Match` on a stale ETag, overwrites. What it shows: code that leans on 412 to lease work.

Writes (PUT, and POST for CompleteMultipartUpload) lose their If-None-Match and If-Match
headers and are re-signed with the server's keys, since SigV4 signs those headers. The body
and the client's x-amz-content-sha256 pass as they came (boto3 sends the body's SHA-256 over
http, STREAMING-UNSIGNED-PAYLOAD-TRAILER for aws-chunked bodies over https): both stay valid.
Only a write whose own signature holds with those keys is re-signed: any other request,
wrong keys included, passes unchanged for the server to judge.
"""

from __future__ import annotations

import hmac
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.servers.http_front import Exchange, HttpFront, Refuse, start_http_front

CONDITIONS = ("If-None-Match", "If-Match")
WRITES = ("PUT", "POST")
REGION = "us-east-1"
AUTHORIZATION = re.compile(r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/\S+,\s*"
                           r"SignedHeaders=(?P<signed>[^,]+),\s*Signature=(?P<signature>[0-9a-f]+)")


class _SignAsSent(S3SigV4Auth):
    """SigV4 over the payload hash the client sent, so its body needs no change."""

    def payload(self, request: Any) -> str:
        return str(request.context["payload_hash"])


@dataclass
class LaxS3:
    upstream: str
    access_key: str
    secret_key: str
    stripped: int = 0  # writes that lost their conditions here
    _front: HttpFront | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def url(self) -> str:
        assert self._front is not None
        return self._front.url

    def close(self) -> None:
        if self._front is not None:
            self._front.close()

    def _on_request(self, req: Exchange) -> None:
        if req.method not in WRITES or not any(req.header(h) is not None for h in CONDITIONS):
            return
        payload = req.header("x-amz-content-sha256")
        if payload is None or not self._signed_by_us(req, payload):
            return  # the server judges it as sent, and refuses it
        if payload.startswith("STREAMING-AWS4-"):
            # Signed chunks chain from the header's signature: a new one breaks them all.
            raise Refuse(501, f"lax_s3 cannot re-sign x-amz-content-sha256: {payload}")
        req.drop(*CONDITIONS, "Authorization", "X-Amz-Date", "x-amz-content-sha256")
        signed = self._request(req, dict(req.headers), payload)
        self._signer().add_auth(signed)
        req.headers = list(signed.headers.items())
        with self._lock:
            self.stripped += 1

    def _signed_by_us(self, req: Exchange, payload: str) -> bool:
        """Whether the client's own signature holds with our keys: a wrong secret must still
        be refused, not re-signed into a good one."""
        auth = AUTHORIZATION.fullmatch(req.header("Authorization") or "")
        stamp = req.header("X-Amz-Date")
        if auth is None or stamp is None or auth["key"] != self.access_key:
            return False
        names = set(auth["signed"].split(";"))
        sent = self._request(req, {k: v for k, v in req.headers if k.lower() in names}, payload)
        sent.context["timestamp"] = stamp
        signer = self._signer()
        expected = signer.signature(
            signer.string_to_sign(sent, signer.canonical_request(sent)), sent)
        return hmac.compare_digest(expected, auth["signature"])

    def _request(self, req: Exchange, headers: dict[str, str], payload: str) -> AWSRequest:
        aws = AWSRequest(method=req.method, url=self.upstream + req.path, headers=headers,
                         data=req.body)
        aws.context["payload_hash"] = payload
        return aws

    def _signer(self) -> _SignAsSent:
        return _SignAsSent(Credentials(self.access_key, self.secret_key), "s3", REGION)


def start_lax_s3(upstream_url: str, access_key: str, secret_key: str) -> LaxS3:
    """Start the front on a free loopback port, in front of `upstream_url` (http only), with
    the keys the server knows (S3Server.access_key, .secret_key)."""
    lax = LaxS3(upstream=upstream_url.rstrip("/"), access_key=access_key,
                secret_key=secret_key)
    lax._front = start_http_front(upstream_url, "lax-s3", lax._on_request)
    return lax
