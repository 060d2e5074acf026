"""What a campaign's shared S3 prefix holds, read with the node's own [s3] settings: the batch
objects directly under it (each streamed, its lines' index and attempt kept), each shard's
uploaded journals (`journals/{tag}/ownership.jsonl` and `failures.jsonl`) as its owned set and
its failures. The union and a reassign judge from these. Blocking."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agents.engine.ownership import Ownership, OwnershipError
from agents.engine.uploader import journal_key
from agents.rundir.batchnames import BatchName, parse_batch_name
from agents.rundir.schema import failure_decoder, line_key_decoder
from agents.rundir.shard import Shard
from agents.rundir.spec import S3Section

CHUNK = 1 << 20
READERS = 8  # batches read from S3 at once


@dataclass(slots=True)
class BatchObject:
    key: str
    name: BatchName
    size: int


@dataclass(slots=True)
class BatchLines:
    """One batch object, read whole: the (index, attempt) of every line."""

    obj: BatchObject
    indices: array[int] = field(default_factory=lambda: array("q"))
    attempts: array[int] = field(default_factory=lambda: array("q"))
    bad_lines: list[int] = field(default_factory=list)
    error: str | None = None  # the object could not be read


def s3_url(s3: S3Section, key: str = "") -> str:
    return f"s3://{s3.bucket}/{key or s3.prefix}"


def list_batches(client: Any, s3: S3Section) -> tuple[list[BatchObject], list[str]]:
    """The batch objects directly under the prefix, and the names under it that look like a
    batch but do not parse as one (a shard tag that does not round-trip)."""
    found: list[BatchObject] = []
    odd: list[str] = []
    token: dict[str, str] = {}
    while True:
        page = client.list_objects_v2(Bucket=s3.bucket, Prefix=s3.prefix, Delimiter="/",
                                      **token)
        for obj in page.get("Contents", []):
            key = str(obj["Key"])
            name = key[len(s3.prefix):]
            parsed = parse_batch_name(name)
            if parsed is not None:
                found.append(BatchObject(key, parsed, int(obj.get("Size", 0))))
            elif name.startswith("completions_"):
                odd.append(name)
        if not page.get("IsTruncated"):
            return sorted(found, key=lambda b: b.key), odd
        token = {"ContinuationToken": page["NextContinuationToken"]}


def read_batch(client: Any, s3: S3Section, obj: BatchObject) -> BatchLines:
    """Stream one batch object; a line that does not parse is kept by its line number."""
    out = BatchLines(obj)
    try:
        body = client.get_object(Bucket=s3.bucket, Key=obj.key)["Body"]
        rest = b""
        lineno = 0
        while True:
            chunk = body.read(CHUNK)
            data = rest + chunk
            if not chunk:
                lines, rest = ([data] if data.strip() else []), b""
            else:
                cut = data.rfind(b"\n") + 1
                lines, rest = data[:cut].split(b"\n")[:-1] if cut else [], data[cut:]
            for raw in lines:
                lineno += 1
                if not raw.strip():
                    continue
                try:
                    k = line_key_decoder.decode(raw)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    out.bad_lines.append(lineno)
                    continue
                if k.index < 0 or k.attempt < 1:
                    out.bad_lines.append(lineno)
                    continue
                out.indices.append(k.index)
                out.attempts.append(k.attempt)
            if not chunk:
                break
    except Exception as exc:  # one unreadable object is named; the others are still read
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    return out


def read_batches(client: Any, s3: S3Section, objects: list[BatchObject]
                 ) -> Iterator[BatchLines]:
    """Every object read, READERS at a time, yielded as each is read."""
    if not objects:
        return
    with ThreadPoolExecutor(max_workers=min(READERS, len(objects))) as pool:
        yield from pool.map(lambda o: read_batch(client, s3, o), objects)


def get_text(client: Any, s3: S3Section, key: str) -> bytes | None:
    """An object's bytes; None when it is not there."""
    from botocore.exceptions import ClientError

    try:
        data: bytes = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        return data
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def failed_indices(data: bytes, where: str) -> tuple[set[int], list[str]]:
    """The indices whose last event in a failures.jsonl is `failed`, and its unreadable lines
    (each named `where:line`)."""
    last: dict[int, str] = {}
    bad: list[str] = []
    lines = data.split(b"\n")
    if data and not data.endswith(b"\n"):
        bad.append(f"{where}: its last line has no newline (torn)")
        lines = lines[:-1]
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            ev = failure_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            bad.append(f"{where}:{lineno}: unreadable failure record: {exc}")
            continue
        if ev.index is not None and ev.event in ("failed", "requeued"):
            last[ev.index] = ev.event
    return {i for i, ev in last.items() if ev == "failed"}, bad


@dataclass
class ShardJournals:
    """One shard's journals as uploaded, read into its owned set and its failures."""

    shard: Shard
    owner: Ownership
    failed: set[int] = field(default_factory=set)
    present: bool = True
    problems: list[str] = field(default_factory=list)


def read_journals(client: Any, s3: S3Section, shard: Shard) -> ShardJournals:
    out = ShardJournals(shard, Ownership(shard))
    for name in ("ownership.jsonl", "failures.jsonl"):
        key = journal_key(s3, shard.tag, name)
        data = get_text(client, s3, key)
        if data is None:
            out.present = False
            out.problems.append(f"shard {shard.text}: no {s3_url(s3, key)} (its engine never "
                                "uploaded its journals: not launched with this [s3]?)")
            continue
        where = s3_url(s3, key)
        if name == "ownership.jsonl":
            try:
                out.owner.apply_bytes(data, where)
            except OwnershipError as exc:
                out.problems.append(str(exc))
        else:
            out.failed, bad = failed_indices(data, where)
            out.problems += bad
    return out


__all__ = ["BatchLines", "BatchObject", "ShardJournals", "failed_indices", "get_text",
           "list_batches", "read_batch", "read_batches", "read_journals", "s3_url"]
