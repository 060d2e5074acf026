"""S3 upload of closed batches: boto3 in a thread, each put carrying its MD5 and SHA-256
(S3 checks both), confirmed by a HEAD showing that SHA-256, recorded in uploads.jsonl.

A closed batch that is not in uploads.jsonl is pending by definition, so a restart re-uploads
exactly those. While S3 is down, batches wait and generation goes on.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from agents.engine.durable import DurableAppend
from agents.rundir.atomic import cut_torn_tail
from agents.rundir.crashpoint import crash_point
from agents.rundir.schema import UploadRecord, encoder, upload_decoder
from agents.rundir.spec import S3Section

log = logging.getLogger("fleetdeck.engine.s3")

JOURNAL_INTERVAL_S = float(os.environ.get("FLEETDECK_JOURNAL_INTERVAL_S", "30"))


class S3Unavailable(RuntimeError):
    pass


class Conflict(RuntimeError):
    """The key holds other bytes than the batch of that name: never overwritten (a lost
    node's run resumed elsewhere, or two runs on one prefix)."""


def precondition_failed(exc: Exception) -> bool:
    """botocore's error for a put refused by `If-None-Match: *` (the key exists)."""
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "412") or status == 412


# How long one S3 call may wait for an answer (a node cut off waits this long per try).
S3_TIMEOUT_S = float(os.environ.get("FLEETDECK_S3_TIMEOUT_S", "30"))


def make_s3_client(spec: S3Section, timeout_s: float | None = None) -> Any:
    import boto3
    from botocore.config import Config

    timeout_s = S3_TIMEOUT_S if timeout_s is None else timeout_s

    session = boto3.session.Session(profile_name=spec.profile or None)
    return session.client(
        "s3",
        endpoint_url=spec.endpoint_url,
        region_name=spec.region or session.region_name or "us-east-1",
        config=Config(retries={"max_attempts": 2, "mode": "standard"},
                      connect_timeout=min(5.0, timeout_s), read_timeout=timeout_s),
    )


def check_bucket(spec: S3Section) -> None:
    """At start: fail before any request when the bucket cannot be reached."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        make_s3_client(spec, timeout_s=10).head_bucket(Bucket=spec.bucket)
    except (BotoCoreError, ClientError) as exc:
        where = spec.endpoint_url or "AWS"
        raise S3Unavailable(f"[s3] bucket {spec.bucket!r} at {where}: {exc}") from None


def file_digests(path: Path) -> tuple[str, str, int]:
    sha = hashlib.sha256()
    md5 = hashlib.md5()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), md5.hexdigest(), size


# A run's journals and pin (what resume-from-s3 restores); a campaign node's sit under its
# node and run id instead (`journals/NODE/RUN_ID/`).
RUN_FOLDER = "run"


def journal_key(spec: S3Section, folder: str, name: str) -> str:
    return f"{spec.prefix}journals/{folder}/{name}"


def put_journals(client: Any, spec: S3Section, folder: str, paths: list[Path]) -> None:
    """Copy a run's journals to `{prefix}journals/{folder}/`, whole lines only (a torn
    tail, from a crash mid-append, was never answered)."""
    for path in paths:
        try:
            body = path.read_bytes()
        except FileNotFoundError:
            body = b""
        body = body[: body.rfind(b"\n") + 1]
        client.put_object(Bucket=spec.bucket, Key=journal_key(spec, folder, path.name),
                          Body=body, ContentType="application/x-ndjson")


def sha256_b64(hexdigest: str) -> str:
    """S3's form of a SHA-256 (x-amz-checksum-sha256): base64 of the digest."""
    return base64.b64encode(bytes.fromhex(hexdigest)).decode()


def head_sha256(head: Mapping[str, Any]) -> str | None:
    """The object's SHA-256 checksum, hex, from a HEAD made with ChecksumMode=ENABLED; None
    when it carries none (put without one, or an S3 that keeps none)."""
    b64 = head.get("ChecksumSHA256")
    if not b64:
        return None
    try:
        return base64.b64decode(str(b64), validate=True).hex()
    except ValueError:
        return f"(not base64: {str(b64)[:60]!r})"


def confirm(head: Mapping[str, Any], url: str, size: int, sha256: str, md5: str
            ) -> Literal["sha256"] | None:
    """How a HEAD confirms the upload: "sha256" by its SHA-256 checksum (the ETag is never
    relied on when there is one), None by ETag = MD5 where S3 keeps no checksum; raises when
    it does not show these bytes."""
    if head.get("ContentLength") != size:
        raise RuntimeError(f"{url}: HEAD says size {head.get('ContentLength')}, expected {size}")
    got = head_sha256(head)
    if got is not None:
        if got != sha256:
            raise RuntimeError(f"{url}: HEAD says SHA-256 {got}, expected {sha256}")
        return "sha256"
    etag = str(head.get("ETag", "")).strip('"')
    if etag != md5:
        raise RuntimeError(f"{url}: HEAD shows no SHA-256 checksum and ETag {etag}, not the "
                           f"MD5 {md5}: the upload cannot be confirmed")
    return None


@dataclass(slots=True)
class Pending:
    path: Path
    sha256: str | None = None


class Uploader:
    def __init__(self, spec: S3Section, run_dir: Path) -> None:
        self.spec = spec
        self.log_path = run_dir / "uploads.jsonl"
        self.uploaded: dict[str, UploadRecord] = {}
        self.bytes = 0
        self.last_error: str | None = None
        self._queue: asyncio.Queue[Pending] = asyncio.Queue()
        self._pending = 0
        self._client: Any = None
        self._file: DurableAppend | None = None
        self._journal_folder = ""
        self._journal_paths: list[Path] = []
        self._stopped = False  # stop(): nothing more goes to S3
        self._journal_changes = 0
        self._journal_sent = 0
        self._journals_wake = asyncio.Event()
        self._journals_now = asyncio.Event()
        self._warned_no_checksum = False
        # Where batches go under the prefix: a campaign node's own folder
        # (`batches/NODE/RUN_ID/`), else the prefix itself.
        self.key_prefix = spec.prefix
        self._uploaded_event = asyncio.Event()

    def recover(self, closed: list[Path]) -> int:
        """Read uploads.jsonl; queue every closed batch not confirmed there."""
        cut_torn_tail(self.log_path)
        if self.log_path.exists():
            with open(self.log_path, "rb") as f:
                for lineno, raw in enumerate(f, 1):
                    if not raw.strip():
                        continue
                    try:
                        rec = upload_decoder.decode(raw)
                    except msgspec.DecodeError as exc:
                        raise ValueError(f"{self.log_path}:{lineno}: unreadable: {exc}") from None
                    self.uploaded[rec.batch] = rec
        self.bytes = sum(r.size for r in self.uploaded.values())
        self._file = DurableAppend(self.log_path, "uploads")
        count = 0
        for path in closed:
            if path.name not in self.uploaded:
                self.submit(path)
                count += 1
        return count

    def submit(self, path: Path, sha256: str | None = None) -> None:
        self._pending += 1
        self._queue.put_nowait(Pending(path, sha256))

    @property
    def pending(self) -> int:
        return self._pending

    def key_for(self, path: Path) -> str:
        return f"{self.key_prefix}{path.name}"

    async def wait_upload(self) -> None:
        """Until the next batch is confirmed in S3."""
        self._uploaded_event.clear()
        await self._uploaded_event.wait()

    def _upload(self, item: Pending) -> UploadRecord:
        if self._client is None:
            self._client = make_s3_client(self.spec)
        sha256, md5, size = file_digests(item.path)
        if item.sha256 and item.sha256 != sha256:
            raise RuntimeError(f"{item.path} changed since it was closed (sha256 differs)")
        key = self.key_for(item.path)
        existed = False
        with open(item.path, "rb") as f:
            try:
                # Only where no object is: a batch in S3 is never overwritten. S3 checks both
                # digests on receipt; the SHA-256 also stays with the object, the proof that
                # still holds where the ETag is not the MD5 (SSE-KMS).
                self._client.put_object(
                    Bucket=self.spec.bucket, Key=key, Body=f,
                    ContentMD5=base64.b64encode(bytes.fromhex(md5)).decode(),
                    ChecksumAlgorithm="SHA256", ChecksumSHA256=sha256_b64(sha256),
                    ContentType="application/x-ndjson", IfNoneMatch="*",
                )
            except Exception as exc:
                if not precondition_failed(exc):
                    raise
                existed = True  # ours, put before a crash took its record, if the HEAD says so
        crash_point("upload")
        head = self._client.head_object(Bucket=self.spec.bucket, Key=key, ChecksumMode="ENABLED")
        etag = str(head.get("ETag", "")).strip('"')
        url = f"s3://{self.spec.bucket}/{key}"
        try:
            checksum = confirm(head, url, size, sha256, md5)
        except RuntimeError as exc:
            if existed:
                raise Conflict(f"{url} already exists with other bytes ({exc}; {item.path} has "
                               f"size {size}, sha256 {sha256}): refused (412), never "
                               "overwritten; another run uploads to this prefix, or this batch "
                               "number was taken by a node this run was resumed from") from None
            raise
        if checksum is None and not self._warned_no_checksum:
            self._warned_no_checksum = True
            log.warning("s3://%s keeps no SHA-256 checksums: uploads are confirmed by ETag = "
                        "MD5, which fails under SSE-KMS", self.spec.bucket)
        rec = UploadRecord(batch=item.path.name, size=size, sha256=sha256, key=key, etag=etag,
                           bucket=self.spec.bucket, uploaded_at=time.time(), checksum=checksum)
        assert self._file is not None, "recover() first"
        # All or nothing: a full disk leaves no half record (the batch is uploaded again).
        self._file.append(encoder.encode(rec) + b"\n")
        return rec

    async def run(self) -> None:
        """Upload forever, one batch at a time, retrying with backoff while S3 is down."""
        delay = 1.0
        while True:
            item = await self._queue.get()
            if self._stopped:
                return
            try:
                rec = await asyncio.to_thread(self._upload, item)
            except Exception as exc:
                self.last_error = f"{item.path.name}: {type(exc).__name__}: {exc}"[:300]
                log.warning("upload of %s failed, retrying in %.0f s: %s",
                            item.path.name, delay, self.last_error)
                # To the back of the queue: one batch that cannot go up must not hold back
                # every batch after it.
                self._queue.put_nowait(item)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            delay = 1.0
            self.uploaded[rec.batch] = rec
            self.bytes += rec.size
            if self._queue.empty():
                self.last_error = None
            self._pending -= 1
            self._uploaded_event.set()
            self.journals_changed()
            log.info("uploaded %s (%d bytes) to s3://%s/%s", rec.batch, rec.size,
                     rec.bucket, rec.key)

    async def drain(self, timeout: float, stop: Callable[[], bool] | None = None,
                    after_stop_s: float = 60.0) -> bool:
        """Wait until nothing is pending, up to timeout, or `after_stop_s` once `stop()` says
        so (a stop must not wait an hour on an S3 outage); True when all are uploaded. A
        stopped uploader uploads nothing more: no wait."""
        deadline = time.monotonic() + timeout
        stop_deadline: float | None = None
        while self._pending and time.monotonic() < deadline and not self._stopped:
            if stop is not None and stop() and stop_deadline is None:
                stop_deadline = time.monotonic() + after_stop_s
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                break
            await asyncio.sleep(0.1)
        return self._pending == 0

    # -- the run's journals in S3 -----------------------------------------------------------

    def watch_journals(self, folder: str, paths: list[Path]) -> None:
        """Keep copies of the run's journals (failures.jsonl) at `{prefix}journals/{folder}/`:
        what resume-from-s3 restores on a new disk, and a campaign node's failures beside its
        batches."""
        self._journal_folder = folder
        self._journal_paths = paths
        self._journal_changes = 1

    def journals_changed(self, now: bool = False) -> None:
        """The journals changed; `now` (the end) skips the pause between uploads that a
        batch's failures wait."""
        if self._journal_paths:
            self._journal_changes += 1
            self._journals_wake.set()
            if now:
                self._journals_now.set()

    @property
    def journals_behind(self) -> bool:
        return self._journal_sent < self._journal_changes

    def _upload_journals(self) -> None:
        if self._client is None:
            self._client = make_s3_client(self.spec)
        put_journals(self._client, self.spec, self._journal_folder, self._journal_paths)

    def stop(self) -> None:
        """Upload nothing more: what waits stays on disk, and what is being put ends."""
        self._stopped = True
        self._journals_wake.set()
        self._queue.put_nowait(Pending(Path()))  # wakes run(), which returns

    async def journals_loop(self) -> None:
        """Upload the journals whenever they changed, retrying with backoff."""
        if not self._journal_paths:
            return
        delay = 1.0
        while True:
            while not self.journals_behind and not self._stopped:
                self._journals_wake.clear()
                await self._journals_wake.wait()
            if self._stopped:
                return
            change = self._journal_changes
            try:
                await asyncio.to_thread(self._upload_journals)
            except Exception as exc:
                self.last_error = f"journals: {type(exc).__name__}: {exc}"[:300]
                log.warning("upload of the journals failed, retrying in %.0f s: %s", delay,
                            self.last_error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            self._journal_sent = change
            delay = 1.0
            # Failures change with every batch: upload them at most every
            # JOURNAL_INTERVAL_S, unless a cede, an adopt or the end wants them now.
            if not self._journals_now.is_set():
                try:
                    await asyncio.wait_for(self._journals_now.wait(), JOURNAL_INTERVAL_S)
                except TimeoutError:
                    pass
            self._journals_now.clear()

    async def drain_journals(self, timeout: float) -> bool:
        """At the end: the journals as they are now, in S3; False after `timeout`."""
        if not self._journal_paths:
            return True
        self.journals_changed(now=True)
        deadline = time.monotonic() + timeout
        while self.journals_behind and time.monotonic() < deadline and not self._stopped:
            await asyncio.sleep(0.1)
        return not self.journals_behind

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
