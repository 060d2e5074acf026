"""What a run's S3 prefix holds, read with the node's own [s3] settings: the batch objects
directly under it and any object's bytes (resume-from-s3 rebuilds a run dir from these).
Blocking."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.rundir.batchnames import BatchName, parse_batch_name
from agents.rundir.spec import S3Section


@dataclass(slots=True)
class BatchObject:
    key: str
    name: BatchName
    size: int


def s3_url(s3: S3Section, key: str = "") -> str:
    return f"s3://{s3.bucket}/{key or s3.prefix}"


def list_batches(client: Any, s3: S3Section) -> tuple[list[BatchObject], list[str]]:
    """The batch objects directly under the prefix, and the names under it that look like a
    batch but do not parse as one."""
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
