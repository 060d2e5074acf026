"""The conditional writes the queue is built on, over boto3 (blocking: call from a thread).

`create` is `PutObject` with `If-None-Match: *` (only where no object is), `replace` is
`PutObject` with `If-Match: ETAG` (only that version). A refusal is 412 PreconditionFailed;
AWS answers 409 ConditionalRequestConflict to a write racing another on the same key, which
is the same answer: someone else's write is the one that holds. Some S3-compatible stores
ignore both headers silently: `probe` finds them before a campaign trusts them."""

from __future__ import annotations

import email.utils
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agents.queue.layout import Layout


class QueueStoreError(RuntimeError):
    """The store cannot hold a queue (it ignores conditional writes), named."""


def _status(exc: Exception) -> tuple[str, int | None]:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code, response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def refused(exc: Exception) -> bool:
    """A conditional write that did not take: the precondition failed, or it raced another."""
    code, status = _status(exc)
    return code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or \
        status in (412, 409)


def missing(exc: Exception) -> bool:
    code, status = _status(exc)
    return code in ("NoSuchKey", "404", "NotFound") or status == 404


def _etag(answer: dict[str, Any]) -> str:
    return str(answer.get("ETag", "")).strip('"')


@dataclass(frozen=True)
class Listed:
    key: str
    etag: str
    last_modified: float  # the store's clock


def create(client: Any, bucket: str, key: str, body: bytes) -> str | None:
    """Put only where no object is: the new ETag, or None when one was there."""
    try:
        return _etag(client.put_object(Bucket=bucket, Key=key, Body=body,
                                       ContentType="application/json", IfNoneMatch="*"))
    except Exception as exc:
        if refused(exc):
            return _ours(client, bucket, key, body)
        raise


def replace(client: Any, bucket: str, key: str, body: bytes, etag: str) -> str | None:
    """Put only over the version with this ETag: the new ETag, or None when it changed (or
    is gone)."""
    try:
        return _etag(client.put_object(Bucket=bucket, Key=key, Body=body,
                                       ContentType="application/json", IfMatch=f'"{etag}"'))
    except Exception as exc:
        if refused(exc):
            return _ours(client, bucket, key, body)
        if missing(exc):
            return None
        raise


def _ours(client: Any, bucket: str, key: str, body: bytes) -> str | None:
    """A refused write whose bytes are there anyway: the client's own retry of a write that
    took (its answer lost on the way back) is refused by the write itself. Every record
    holds its writer and a fine clock, so the same bytes mean the same write."""
    got = read(client, bucket, key, limit=len(body) + 1)
    return got[1] if got is not None and got[0] == body else None


def read(client: Any, bucket: str, key: str, limit: int = 1 << 20) -> tuple[bytes, str] | None:
    """An object's bytes (at most `limit`: a record is kilobytes) and ETag; None when absent."""
    try:
        got = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{limit - 1}")
    except Exception as exc:
        if missing(exc):
            return None
        raise
    return got["Body"].read(limit), _etag(got)


def exists(client: Any, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        if missing(exc):
            return False
        raise
    return True


def listing(client: Any, bucket: str, prefix: str) -> tuple[list[Listed], float]:
    """Every object under prefix, and the store's clock when the listing ended (its Date
    header): expiry is judged on one clock, the store's, not on each node's."""
    out: list[Listed] = []
    now = time.time()
    token: str | None = None
    while True:
        kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kw["ContinuationToken"] = token
        page = client.list_objects_v2(**kw)
        now = _server_time(page) or now
        for obj in page.get("Contents", []):
            out.append(Listed(str(obj["Key"]), _etag(obj), obj["LastModified"].timestamp()))
        if not page.get("IsTruncated"):
            return out, now
        token = page.get("NextContinuationToken")


def keys(client: Any, bucket: str, prefix: str) -> Iterator[str]:
    for item in listing(client, bucket, prefix)[0]:
        yield item.key


def _server_time(answer: dict[str, Any]) -> float | None:
    date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not date:
        return None
    try:
        return email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None


def probe(client: Any, bucket: str, layout: Layout, where: str) -> None:
    """Refuse a store that ignores conditional writes: a second create of one key must be
    refused, and so must a replace against a stale ETag. QueueStoreError names the store."""
    key = layout.probe(secrets.token_hex(8))
    try:
        first = create(client, bucket, key, b'{"probe": 1}')
        if first is None:
            raise QueueStoreError(f"{where}: s3://{bucket}/{key}: a create of a fresh key was "
                                  "refused")
        if create(client, bucket, key, b'{"probe": 2}') is not None:
            raise QueueStoreError(
                f"{where} ignores If-None-Match: a second conditional create of "
                f"s3://{bucket}/{key} was accepted, so two nodes could both claim one chunk "
                "and both commit it. A campaign needs a store with conditional writes (AWS S3, "
                "SeaweedFS >= 4, MinIO >= 2024, Ceph RGW >= Reef)")
        stale = "0" * 32 if first != "0" * 32 else "1" * 32
        if replace(client, bucket, key, b'{"probe": 3}', stale) is not None:
            raise QueueStoreError(
                f"{where} ignores If-Match: a replace of s3://{bucket}/{key} against a stale "
                "ETag was accepted, so a lease could be taken from under its holder")
    finally:
        try:
            client.delete_object(Bucket=bucket, Key=key)
        except Exception:  # a probe key left behind is harmless
            pass
