"""Reassign records: `{prefix}journals/reassign/{id}.json` in a campaign's S3 prefix says a
shard's not-done indices moved to another node because its own was dead for good. The record
is written before the other node adopts them, and an engine whose shard was reassigned refuses
to start: a node brought back must not send (or upload) what another node now owns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from agents.engine import EngineError
from agents.engine.uploader import make_s3_client
from agents.rundir.shard import Shard
from agents.rundir.spec import S3Section

FOLDER = "journals/reassign/"


class ReassignRecord(msgspec.Struct):
    id: str
    shard: str  # the dead node's shard, "2/4"
    node: str  # the dead node
    to: str  # the node that adopts
    time: float
    count: int  # indices moved
    ranges: list[tuple[int, int, int]]


_decoder = msgspec.json.Decoder(ReassignRecord)


def reassign_id(shard_tag: str) -> str:
    """A shard's reassign id: one per shard, so a retry finds the record it wrote, and a
    running node can look for its own before every put."""
    return f"reassign-{shard_tag}"


def reassign_key(s3: S3Section, id_: str) -> str:
    return f"{s3.prefix}{FOLDER}{id_}.json"


def read_reassigns(client: Any, s3: S3Section) -> list[ReassignRecord]:
    """Every reassign record under the prefix; one that does not parse is an error naming its
    key (a campaign's ownership must never be guessed)."""
    found: list[ReassignRecord] = []
    token: dict[str, str] = {}
    while True:
        page = client.list_objects_v2(Bucket=s3.bucket, Prefix=f"{s3.prefix}{FOLDER}",
                                      **token)
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if not key.endswith(".json"):
                continue
            body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            try:
                found.append(_decoder.decode(body))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise EngineError(f"s3://{s3.bucket}/{key}: unreadable reassign record: "
                                  f"{exc}") from None
        if not page.get("IsTruncated"):
            return found
        token = {"ContinuationToken": page["NextContinuationToken"]}


def reassigned_why(s3: S3Section, shard: Shard, run_dir: Path) -> str | None:
    """Why this shard is no longer this node's (a reassign record names it), or None;
    EngineError when the records cannot be read."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        records = read_reassigns(make_s3_client(s3, timeout_s=10), s3)
    except (BotoCoreError, ClientError) as exc:
        raise EngineError(f"[s3] bucket {s3.bucket!r}: cannot read the campaign's reassign "
                          f"records: {exc}") from None
    for rec in records:
        if rec.shard == shard.text:
            return (f"{run_dir}: shard {shard.text} was reassigned from {rec.node} to {rec.to} "
                    f"(s3://{s3.bucket}/{reassign_key(s3, rec.id)}, {rec.count} indices): "
                    "this node must not run it; its finished batches in S3 still count")
    return None


def refuse_if_reassigned(s3: S3Section, shard: Shard, run_dir: Path) -> None:
    why = reassigned_why(s3, shard, run_dir)
    if why is not None:
        raise EngineError(why)


__all__ = ["FOLDER", "ReassignRecord", "read_reassigns", "reassign_key", "reassigned_why",
           "refuse_if_reassigned"]
