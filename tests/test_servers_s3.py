"""The s3 fixture is a real SeaweedFS S3 server: boto3 round trip, credentials enforced."""

from __future__ import annotations

import hashlib
import os

import pytest
from botocore.exceptions import ClientError

from tests.servers.s3 import S3Server


def test_round_trip_with_etag_and_sha256(s3: S3Server, tmp_path) -> None:
    body = os.urandom(3 * 1024 * 1024 + 17)
    src = tmp_path / "batch.jsonl"
    src.write_bytes(body)
    client = s3.client()
    client.upload_file(str(src), s3.bucket, "run/completions_000000.jsonl")
    head = client.head_object(Bucket=s3.bucket, Key="run/completions_000000.jsonl")
    assert head["ContentLength"] == len(body)
    assert head["ETag"].strip('"') == hashlib.md5(body).hexdigest()
    dst = tmp_path / "back.jsonl"
    client.download_file(s3.bucket, "run/completions_000000.jsonl", str(dst))
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == hashlib.sha256(body).hexdigest()


def test_wrong_credentials_are_refused(s3: S3Server) -> None:
    bad = s3.client(secret_key="not-the-secret-" + "0" * 24)
    with pytest.raises(ClientError) as err:
        bad.put_object(Bucket=s3.bucket, Key="x", Body=b"nope")
    assert err.value.response["Error"]["Code"] in {"SignatureDoesNotMatch", "AccessDenied"}
    stranger = s3.client(access_key="AKIDSTRANGER000000", secret_key="x" * 40)
    with pytest.raises(ClientError):
        stranger.list_objects_v2(Bucket=s3.bucket)


def test_kill_and_restart_keeps_objects(s3: S3Server) -> None:
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="keep", Body=b"kept")
    s3.kill()
    with pytest.raises(Exception):  # noqa: B017 - any connection error will do
        s3.client().head_object(Bucket=s3.bucket, Key="keep")
    s3.restart()
    assert s3.client().get_object(Bucket=s3.bucket, Key="keep")["Body"].read() == b"kept"
