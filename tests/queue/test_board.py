"""The queue's S3 primitives against the real SeaweedFS: a chunk claimed once, a lease
renewed only by its holder, taken over only past its term, a commit that only the first
writer gets, and a store that ignores conditional writes refused by the probe."""

from __future__ import annotations

import time
import uuid

import pytest

from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.board import Board, BoardError, Me
from agents.queue.layout import Layout
from tests.servers.lax_s3 import start_lax_s3
from tests.servers.ports import wait_until
from tests.servers.s3 import S3Server


def _prefix() -> str:
    return f"t/{uuid.uuid4().hex[:8]}/"


def _pin(lines: int = 25, chunk: int = 10, **kw: object) -> rec.CampaignPin:
    fields = dict(campaign="c", prompts_sha256="ab" * 32, prompts_lines=lines, chunk_size=chunk,
                  model="m", sampling={"temperature": 0.6}, chat_template_kwargs={},
                  created_at=time.time(), created_by="a")
    fields.update(kw)
    return rec.CampaignPin(**fields)  # type: ignore[arg-type]


def _board(s3: S3Server, prefix: str, node: str, lease_s: float = 60.0) -> Board:
    return Board(s3.client(), s3.bucket, prefix, Me(node, f"run-{node}"), lease_s, 0.0)


def _commit(g: int, n: int, node: str, done: list[tuple[int, int]]) -> rec.Commit:
    return rec.Commit(generation=g, chunk=n, node=node, run_id=f"run-{node}", epoch=1,
                      started_at=time.time(), committed_at=time.time(), done=done, failed=[],
                      truncated=[], batches=[], attempt=g + 1)


def test_a_chunk_is_claimed_once_and_its_lease_renewed_only_by_its_holder(
        queue_s3: S3Server) -> None:
    prefix = _prefix()
    a, b = _board(queue_s3, prefix, "a"), _board(queue_s3, prefix, "b")
    pin = a.pin(_pin())
    assert b.pin(_pin(created_by="b", created_at=1.0)) == pin  # the first pin holds
    assert a.generations(pin) == [0] and [c.indices for c in a.chunks(0)] == [
        [(0, 10)], [(10, 20)], [(20, 25)]]
    chunk = a.chunks(0)[1]
    held = a.claim(chunk)
    assert held is not None and held.epoch == 1
    assert b.claim(chunk) is None  # 412: a's
    st = b.state(0)
    assert set(st.leases) == {1} and [c.number for c in st.free()] == [0, 2]
    assert not b.expired(st, 1)
    assert b.take_over(chunk, st) is None  # not past its term
    old = held.etag
    assert a.renew(held) and held.etag != old
    # A renewal with a stale ETag (a zombie's) is refused.
    stale = type(held)(chunk, 1, old, held.claimed_at)
    assert not a.renew(stale)


def test_a_lease_past_its_term_is_taken_over_once_and_its_holder_cannot_renew(
        queue_s3: S3Server) -> None:
    prefix = _prefix()
    a, b, c = (_board(queue_s3, prefix, n, lease_s=2.0) for n in "abc")
    pin = a.pin(_pin())
    b.generations(pin), c.generations(pin)
    chunk = a.chunks(0)[0]
    held = a.claim(chunk)
    assert held is not None

    def expired() -> bool:
        return b.expired(b.state(0), 0)

    wait_until(expired, 60, "the lease is past its term on the store's clock")
    st_b, st_c = b.state(0), c.state(0)
    took = b.take_over(chunk, st_b)
    assert took is not None and took.epoch == 2
    assert c.take_over(chunk, st_c) is None  # b was first (If-Match on the same ETag)
    assert not a.renew(held)  # the old holder lost it
    got = a.read_lease(chunk)
    assert got is not None and (got[0].node, got[0].epoch) == ("b", 2)


def test_a_released_lease_is_free_at_once(queue_s3: S3Server) -> None:
    prefix = _prefix()
    a, b = _board(queue_s3, prefix, "a"), _board(queue_s3, prefix, "b")
    pin = a.pin(_pin())
    b.generations(pin)
    chunk = a.chunks(0)[2]
    held = a.claim(chunk)
    assert held is not None
    a.release(held)
    took = b.take_over(chunk, b.state(0))
    assert took is not None and took.epoch == 2


def test_a_chunk_runs_for_as_long_as_the_store_saw_whatever_its_holders_clock_says(
        queue_s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backup is judged on the store's clock: a holder an hour behind must not look an hour
    into its chunk (it was backed up at once), nor one an hour ahead look never started."""
    prefix = _prefix()
    a, b = _board(queue_s3, prefix, "a"), _board(queue_s3, prefix, "b")
    pin = a.pin(_pin())
    b.generations(pin)
    real = time.time
    for n, skew in ((0, -3600.0), (1, 3600.0)):
        monkeypatch.setattr("agents.queue.board.time.time", lambda skew=skew: real() + skew)
        held = a.claim(a.chunks(0)[n])
        assert held is not None and a.renew(held)
        monkeypatch.setattr("agents.queue.board.time.time", real)
        got = b.running_s(b.state(0), n)
        assert got is not None and got[0].node == "a"
        assert -30 < got[1] < 60, (skew, got[1])
    # A lease renewed after the listing is judged on the next look, not with a stale offset.
    st = b.state(0)
    assert a.renew(held)
    assert b.running_s(st, 1) is None


def test_the_first_commit_wins_and_the_same_commit_again_is_its_writers(
        queue_s3: S3Server) -> None:
    prefix = _prefix()
    a, b = _board(queue_s3, prefix, "a"), _board(queue_s3, prefix, "b")
    a.pin(_pin())
    first = _commit(0, 0, "a", [(0, 10)])
    assert a.commit(first) == (True, None)
    assert a.commit(_commit(0, 0, "a", [(0, 10)])) == (True, None)  # ours, after a crash
    won, there = b.commit(_commit(0, 0, "b", [(0, 10)]))
    assert not won and there is not None and there.node == "a"
    assert b.committed(a.chunks(0)[0])


def test_a_pin_that_means_another_run_is_refused_naming_both(queue_s3: S3Server) -> None:
    prefix = _prefix()
    _board(queue_s3, prefix, "a").pin(_pin())
    with pytest.raises(BoardError, match=r"chunk_size 10.*chunk_size 20"):
        _board(queue_s3, prefix, "b").pin(_pin(chunk=20))


def test_a_store_that_ignores_conditional_writes_is_refused_by_the_probe(
        queue_s3: S3Server) -> None:
    s3ops.probe(queue_s3.client(), queue_s3.bucket, Layout(_prefix()), "SeaweedFS")
    lax = start_lax_s3(queue_s3.endpoint_url, queue_s3.access_key, queue_s3.secret_key)
    try:
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=lax.url, aws_access_key_id=queue_s3.access_key,
                              aws_secret_access_key=queue_s3.secret_key, region_name="us-east-1",
                              config=Config(retries={"total_max_attempts": 1}))
        with pytest.raises(s3ops.QueueStoreError, match=r"the lax store ignores If-None-Match"):
            s3ops.probe(client, queue_s3.bucket, Layout(_prefix()), "the lax store")
        assert lax.stripped >= 1
        assert not list(s3ops.keys(client, queue_s3.bucket, "probe/"))  # cleaned up
    finally:
        lax.close()


def test_a_write_whose_answer_was_lost_is_still_its_writers(queue_s3: S3Server) -> None:
    """botocore retries a put whose answer it lost; the retry is refused (412) by the write
    that took. The same bytes there mean it was ours."""
    client, bucket, key = queue_s3.client(), queue_s3.bucket, _prefix() + "k"
    body = b'{"node": "a", "at": 1.25}'
    etag = s3ops.create(client, bucket, key, body)
    assert etag is not None
    assert s3ops.create(client, bucket, key, body) == etag  # the "retry": ours
    assert s3ops.create(client, bucket, key, body + b" ") is None  # someone else's bytes
    new = s3ops.replace(client, bucket, key, b'{"v": 2}', etag)
    assert new is not None and s3ops.replace(client, bucket, key, b'{"v": 2}', etag) == new
    assert s3ops.replace(client, bucket, key, b'{"v": 3}', etag) is None
