"""The fronts before a real SeaweedFS S3 that the many-node queue tests use: a TCP front a
test can cut off (a node's network partition) and a lax front that ignores conditional
writes (an S3-compatible store without 412)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

from tests.servers.lax_s3 import LaxS3, start_lax_s3
from tests.servers.ports import wait_until
from tests.servers.s3 import S3Server, running_s3
from tests.servers.tcp_front import TcpFront, start_tcp_front

# What a node under a partition waits before it gives up, and the most the test allows
# for it: generous, for a loaded machine, yet bounded.
SHORT_TIMEOUT_S = 2
GIVE_UP_BOUND_S = 30.0
PATIENT_TIMEOUT_S = 60  # everything that should answer, on a loaded machine


@pytest.fixture(scope="module")
def shared_s3() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server


@pytest.fixture
def front(shared_s3: S3Server) -> Iterator[TcpFront]:
    front = start_tcp_front(shared_s3.endpoint_url)
    try:
        yield front
    finally:
        front.close()


@pytest.fixture
def lax(shared_s3: S3Server) -> Iterator[LaxS3]:
    lax = start_lax_s3(shared_s3.endpoint_url, shared_s3.access_key, shared_s3.secret_key)
    try:
        yield lax
    finally:
        lax.close()


def client(s3: S3Server, url: str, timeout_s: float = PATIENT_TIMEOUT_S,
           secret_key: str | None = None) -> Any:
    """A boto3 client for `url` with the server's keys: it signs for `url`'s host. One try
    only (retries' max_attempts counts retries, total_max_attempts the tries)."""
    return boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id=s3.access_key, aws_secret_access_key=secret_key or s3.secret_key,
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=timeout_s,
                      read_timeout=timeout_s))


def status(err: pytest.ExceptionInfo[ClientError]) -> int:
    return int(err.value.response["ResponseMetadata"]["HTTPStatusCode"])


def times_out(call: Any, **kwargs: Any) -> float:
    """Run a call that must give up on a timeout (not a refusal); return how long it took."""
    start = time.monotonic()
    with pytest.raises((ReadTimeoutError, ConnectTimeoutError)):
        call(**kwargs)
    return time.monotonic() - start


def http_get(sock: socket.socket, host: str) -> bytes:
    """One raw HTTP request on an open connection, its answer read whole; its status line."""
    sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += _recv(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    assert length, head
    while len(body) < int(length[1]):
        body += _recv(sock)
    return head.split(b"\r\n", 1)[0]


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    assert data, "connection closed before a whole answer"
    return data


def test_tcp_front_passes_calls_signed_for_its_own_url(shared_s3: S3Server,
                                                       front: TcpFront) -> None:
    """The client signs Host = the front's address; SeaweedFS checks the signature against
    the Host header it receives, which the front passes as sent."""
    assert front.url.startswith("http://127.0.0.1:") and front.url != shared_s3.endpoint_url
    s3 = client(shared_s3, front.url)
    s3.put_object(Bucket=shared_s3.bucket, Key="tcp/one", Body=b"through the front")
    got = s3.get_object(Bucket=shared_s3.bucket, Key="tcp/one")["Body"].read()
    assert got == b"through the front"
    listed = s3.list_objects_v2(Bucket=shared_s3.bucket, Prefix="tcp/")
    assert [o["Key"] for o in listed["Contents"]] == ["tcp/one"]
    wrong = client(shared_s3, front.url, secret_key="not-the-secret-" + "0" * 24)
    with pytest.raises(ClientError) as err:
        wrong.get_object(Bucket=shared_s3.bucket, Key="tcp/one")
    assert status(err) == 403  # the front forwards; the server still checks


def test_blackhole_stops_open_and_new_connections_without_refusing(
        shared_s3: S3Server, front: TcpFront) -> None:
    host = front.url.removeprefix("http://")
    address = (host.split(":")[0], int(host.split(":")[1]))
    old = socket.create_connection(address, timeout=PATIENT_TIMEOUT_S)
    try:
        assert http_get(old, host).startswith(b"HTTP/1.1 ")
        front.blackhole()
        old.settimeout(SHORT_TIMEOUT_S)
        with pytest.raises(TimeoutError):
            http_get(old, host)
        new = socket.create_connection(address, timeout=SHORT_TIMEOUT_S)  # taken, not refused
        try:
            with pytest.raises(TimeoutError):
                http_get(new, host)
            front.restore()
            # Both lived through the blackhole: dropped, and what they sent is never answered.
            old.settimeout(PATIENT_TIMEOUT_S)
            new.settimeout(PATIENT_TIMEOUT_S)
            assert old.recv(65536) == b""
            assert new.recv(65536) == b""
        finally:
            new.close()
    finally:
        old.close()
    with socket.create_connection(address, timeout=PATIENT_TIMEOUT_S) as fresh:
        assert http_get(fresh, host).startswith(b"HTTP/1.1 ")


def test_boto3_times_out_through_a_blackhole_and_recovers(shared_s3: S3Server,
                                                          front: TcpFront) -> None:
    bucket = shared_s3.bucket
    node = client(shared_s3, front.url, timeout_s=SHORT_TIMEOUT_S)

    def node_answers() -> bool:  # the short timeout may not hold on a loaded machine
        try:
            node.put_object(Bucket=bucket, Key="hole/before", Body=b"before")
            return True
        except (ReadTimeoutError, ConnectTimeoutError):
            return False

    wait_until(node_answers, PATIENT_TIMEOUT_S * 2, "a put through the front")
    front.blackhole()
    # The pooled connection first, then a fresh client's new one: both wait, neither refuses.
    took = times_out(node.get_object, Bucket=bucket, Key="hole/before")
    assert SHORT_TIMEOUT_S * 0.9 <= took < GIVE_UP_BOUND_S
    other = client(shared_s3, front.url, timeout_s=SHORT_TIMEOUT_S)
    took = times_out(other.put_object, Bucket=bucket, Key="hole/lost", Body=b"lost")
    assert SHORT_TIMEOUT_S * 0.9 <= took < GIVE_UP_BOUND_S
    front.restore()
    s3 = client(shared_s3, front.url)
    assert s3.get_object(Bucket=bucket, Key="hole/before")["Body"].read() == b"before"
    with pytest.raises(ClientError) as err:  # the put sent into the blackhole never landed
        s3.head_object(Bucket=bucket, Key="hole/lost")
    assert status(err) == 404
    s3.put_object(Bucket=bucket, Key="hole/after", Body=b"after")
    straight = client(shared_s3, shared_s3.endpoint_url)
    assert straight.get_object(Bucket=bucket, Key="hole/after")["Body"].read() == b"after"


def test_seaweedfs_refuses_conditional_writes_and_the_lax_front_ignores_them(
        shared_s3: S3Server, lax: LaxS3) -> None:
    bucket = shared_s3.bucket
    for name, url in (("straight", shared_s3.endpoint_url), ("lax", lax.url)):
        s3 = client(shared_s3, url)
        key = f"cond/{name}"
        first = s3.put_object(Bucket=bucket, Key=key, Body=b"v1", IfNoneMatch="*")["ETag"]
        second = s3.put_object(Bucket=bucket, Key=key, Body=b"v2")["ETag"]
        assert first != second
        if name == "straight":
            with pytest.raises(ClientError) as err:
                s3.put_object(Bucket=bucket, Key=key, Body=b"again", IfNoneMatch="*")
            assert status(err) == 412
            assert err.value.response["Error"]["Code"] == "PreconditionFailed"
            with pytest.raises(ClientError) as err:
                s3.put_object(Bucket=bucket, Key=key, Body=b"stale", IfMatch=first)
            assert status(err) == 412
            expected = b"v2"
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=b"again", IfNoneMatch="*")
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"again"
            s3.put_object(Bucket=bucket, Key=key, Body=b"stale", IfMatch=first)
            expected = b"stale"
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == expected
    # The first create of each key went through it too, conditions dropped.
    assert lax.stripped == 3


def test_lax_front_passes_the_rest_unchanged_and_keeps_credentials_checked(
        shared_s3: S3Server, lax: LaxS3) -> None:
    bucket = shared_s3.bucket
    s3 = client(shared_s3, lax.url)
    s3.put_object(Bucket=bucket, Key="lax/plain", Body=b"plain")
    assert s3.get_object(Bucket=bucket, Key="lax/plain")["Body"].read() == b"plain"
    assert lax.stripped == 0
    wrong = client(shared_s3, lax.url, secret_key="not-the-secret-" + "0" * 24)
    with pytest.raises(ClientError) as err:
        wrong.put_object(Bucket=bucket, Key="lax/plain", Body=b"nope", IfNoneMatch="*")
    assert status(err) == 403 and lax.stripped == 0
    assert s3.get_object(Bucket=bucket, Key="lax/plain")["Body"].read() == b"plain"
