"""A campaign's union judged from S3 alone (issue 15, item 3), against a real S3 holding what
three shards would have uploaded, written here line by line so each way the union can break is
made on purpose: an index in two shards' batches, a batch gone, a cede nobody adopted, a line
that does not parse, a reassign record with and without its adopt. And the reassign plan: the
dead shard's not-done indices, the record in S3 before anything else, a retry finding it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.artifacts.reassign import ReassignRefused, plan_reassign
from agents.artifacts.union import UnionReport, indices_text, union_report
from agents.engine.ownership import adopt_event, cede_event, encode
from agents.rundir.batchnames import batch_name
from agents.rundir.schema import RunPin
from agents.rundir.shard import Shard
from tests.servers.s3 import S3Server, start_s3

N, TOTAL, PREFIX = 3, 30, "camp/"


class Campaign:
    """What three shards put under one prefix: batches, journals, reassign records."""

    def __init__(self, s3: S3Server) -> None:
        self.s3 = s3
        self.client = s3.client()

    def put(self, name: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.s3.bucket, Key=PREFIX + name, Body=body)

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.s3.bucket, Key=PREFIX + name)

    def batch(self, k: int, number: int, indices: list[int], extra: bytes = b"") -> str:
        name = batch_name(number, shard=Shard(k, N))
        lines = [json.dumps({"index": i, "attempt": 1, "messages": [], "finish_reason": "stop",
                             "usage": {}}).encode() for i in indices]
        self.put(name, b"\n".join(lines) + b"\n" + extra)
        return name

    def journals(self, k: int, moves: list[Any] = (), failed: list[int] = ()) -> None:
        tag = Shard(k, N).tag
        self.put(f"journals/{tag}/ownership.jsonl", b"".join(encode(e) + b"\n" for e in moves))
        self.put(f"journals/{tag}/failures.jsonl", b"".join(
            json.dumps({"event": "failed", "time": 1.0, "index": i, "error": "http_500"})
            .encode() + b"\n" for i in failed))


def run_dir(tmp_path: Path, s3: S3Server, shard: str | None) -> Path:
    """A node's run dir as the union reads it: its [s3] and its pin."""
    folder = tmp_path / f"node-{(shard or 'none').replace('/', 'of')}"
    folder.mkdir()
    (folder / "run.toml").write_text(
        f'[run]\nname = "u"\n\n[s3]\nbucket = "{s3.bucket}"\nprefix = "{PREFIX}"\n'
        f'endpoint_url = "{s3.endpoint_url}"\nregion = "us-east-1"\n')
    pin = RunPin(prompts_path="p", prompts_sha256="0" * 64, prompts_lines=TOTAL, prompts_size=1,
                 prompts_mtime_ns=1, model="m", sampling={}, chat_template_kwargs={},
                 created_at=1.0, shard=shard)
    (folder / "run.pin.json").write_bytes(msgspec.json.encode(pin))
    return folder


def check(report: UnionReport, name: str) -> str:
    """The detail of a failing check (asserting it fails)."""
    (c,) = [c for c in report.checks if c.name == name]
    assert not c.ok, f"{name} passed: {c.detail}"
    return c.detail


def failing(report: UnionReport) -> list[str]:
    return [c.name for c in report.checks if not c.ok]


@pytest.fixture(scope="module")
def one_s3() -> Iterator[S3Server]:
    with tempfile.TemporaryDirectory(prefix="fd-s3-") as d:
        server = start_s3(Path(d))
        try:
            yield server
        finally:
            server.kill()


@pytest.fixture
def s3_env(one_s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """One S3 for the module, its prefix emptied for each test; its keys in the environment,
    where the union's boto3 finds them."""
    client = one_s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=one_s3.bucket,
                                                                  Prefix=PREFIX):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=one_s3.bucket, Key=obj["Key"])
    for k, v in one_s3.env().items():
        monkeypatch.setenv(k, v)
    return one_s3


def good_campaign(s3: S3Server) -> Campaign:
    """0/3 did all of its ten; 1/3 did eight, one failed (22) and ceded 25 and 28 to 2/3
    (cede rb-1), which did its own ten and those two."""
    c = Campaign(s3)
    c.batch(0, 1, [0, 3, 6, 9, 12])
    c.batch(0, 2, [15, 18, 21, 24, 27])
    c.journals(0)
    c.batch(1, 1, [1, 4, 7, 10, 13, 16, 19])
    c.journals(1, [cede_event("rb-1", [25, 28])], failed=[22])
    c.batch(2, 1, [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 25, 28])
    c.journals(2, [adopt_event("rb-1", [25, 28], "gen-2", "1/3")])
    return c


def test_indices_as_ranges() -> None:
    assert indices_text([5, 1, 2, 3, 9]) == "1-3, 5, 9"
    assert indices_text(range(0, 40, 2)) == "0-38 step 2"
    assert indices_text([1, 4, 10]) == "1, 4, 10"
    assert indices_text([]) == "none"
    assert indices_text([0, 1, 5, 7, 20, 30], limit=2) == "0-1, 5, 7, ... (1 more ranges)"


def test_the_union_names_each_way_it_breaks(tmp_path: Path, s3_env: S3Server) -> None:
    c = good_campaign(s3_env)
    node = run_dir(tmp_path, s3_env, "2/3")
    nodes = ["gen-1", "gen-2", "gen-3"]
    r = union_report(node, nodes=nodes)  # N and the line count from this node's pin
    assert r.ok, r.problems
    assert (r.n, r.prompts_lines) == (N, TOTAL) and r.unadopted == []
    got = {s.shard: (s.node, s.batches, s.done, s.failed, s.owned) for s in r.shards}
    assert got == {"0/3": ("gen-1", 2, 10, 0, 10), "1/3": ("gen-2", 1, 7, 1, 8),
                   "2/3": ("gen-3", 1, 12, 0, 12)}

    # Another shard's line in a batch: the index is done twice, both shards named.
    stray = json.dumps({"index": 4, "attempt": 1}).encode() + b"\n"
    c.batch(2, 2, [], extra=stray)
    r = union_report(node, nodes=nodes)
    assert failing(r) == ["done_once", "done_by_owner"]
    assert check(r, "done_once") == ("1 indices done twice, in the batches of shards "
                                     "1/3 (gen-2) and 2/3 (gen-3): 4")
    assert "shard 2/3 (gen-3)'s batches are owned by shard 1/3 (gen-2): 4" in \
        check(r, "done_by_owner")
    c.delete(batch_name(2, shard=Shard(2, N)))

    # A batch gone from S3: its indices are missing, named by their shard.
    c.delete(batch_name(2, shard=Shard(0, N)))
    r = union_report(node, nodes=nodes)
    assert failing(r) == ["complete"]
    assert check(r, "complete") == ("5 indices of shard 0/3 (gen-1) neither done nor failed "
                                    "(missing): 15-27 step 3")
    c.batch(0, 2, [15, 18, 21, 24, 27])

    # The adopt lost: rb-1 is a cede nobody adopted, listed by its id; what 2/3 did of it is
    # done by a shard that does not own it.
    c.journals(2)
    r = union_report(node, nodes=nodes)
    assert failing(r) == ["done_by_owner", "adopted"]
    (u,) = r.unadopted
    assert (u.id, u.shard, u.node, u.count, u.ranges, u.reassign) == \
        ("rb-1", "1/3", "gen-2", 2, "25, 28", False)
    assert check(r, "adopted") == ("shard 1/3 (gen-2): cede rb-1: 2 indices nobody adopted: "
                                   "25, 28")
    c.journals(2, [adopt_event("rb-1", [25, 28], "gen-2", "1/3")])

    # A line that does not parse, and a journal line that does not: named with where.
    c.batch(0, 3, [], extra=b"{not json\n")
    c.put("journals/s00of03/failures.jsonl", b"{oops\n")
    r = union_report(node, nodes=nodes)
    assert failing(r) == ["batches", "journals"]
    assert f"{batch_name(3, shard=Shard(0, N))}: lines 2 do not parse" in check(r, "batches")
    assert f"s3://{s3_env.bucket}/camp/journals/s00of03/failures.jsonl:1: unreadable" in \
        check(r, "journals")
    # A batch of no shard of this campaign is named too.
    c.delete(batch_name(3, shard=Shard(0, N)))
    c.journals(0)
    c.put(batch_name(1, shard=Shard(0, 2)), b"")
    r = union_report(node, nodes=nodes)
    assert "shard 0/2, not one of this campaign's 3" in check(r, "batches")
    c.delete(batch_name(1, shard=Shard(0, 2)))
    assert union_report(node).ok


def test_reassign_moves_what_s3_says_is_not_done(tmp_path: Path, s3_env: S3Server) -> None:
    c = good_campaign(s3_env)
    # 1/3's node died before its last batch: 13, 16 and 19 are not in S3.
    c.batch(1, 1, [1, 4, 7, 10])
    node = run_dir(tmp_path, s3_env, "2/3")
    r = union_report(node)
    assert check(r, "complete") == ("3 indices of shard 1/3 neither done nor failed "
                                    "(missing): 13-19 step 3")

    with pytest.raises(ReassignRefused, match="runs shard 2/3 itself"):
        plan_reassign(node, "reassign-s02of03", "2/3", "gen-3", "gen-1")
    rec, existed, url = plan_reassign(node, "reassign-s01of03", "1/3", "gen-2", "gen-3")
    # Owned (less the cede to 2/3) - done in S3 - failed (22): 13, 16, 19.
    assert (rec.count, rec.ranges, existed) == (3, [(13, 20, 3)], False)
    assert url == f"s3://{s3_env.bucket}/camp/journals/reassign/reassign-s01of03.json"
    stored = c.client.get_object(Bucket=s3_env.bucket,
                                 Key="camp/journals/reassign/reassign-s01of03.json")
    assert json.loads(stored["Body"].read())["ranges"] == [[13, 20, 3]]

    # The record, not yet adopted: the dead shard's cede waiting by the record's id.
    r = union_report(node, nodes=["gen-1", "gen-2", "gen-3"])
    assert failing(r) == ["adopted"]  # 13-19 are nobody's now: not "missing" twice over
    (u,) = r.unadopted
    assert (u.id, u.shard, u.reassign, u.ranges) == ("reassign-s01of03", "1/3", True,
                                                     "13-19 step 3")
    assert "reassign record reassign-s01of03: 3 indices nobody adopted" in check(r, "adopted")
    (s1,) = [s for s in r.shards if s.shard == "1/3"]
    assert s1.reassigned_to == "gen-3" and s1.owned == 5  # 1, 4, 7, 10 and 22 (failed)

    # A retry finds the record (the same ranges, even if S3 changed since); to another node,
    # it is refused.
    c.batch(1, 2, [13])
    rec2, existed, _ = plan_reassign(node, "reassign-s01of03", "1/3", "gen-2", "gen-3")
    assert existed and rec2.ranges == rec.ranges
    with pytest.raises(ReassignRefused, match="already reassigned from gen-2 to gen-3"):
        plan_reassign(node, "reassign-s01of03", "1/3", "gen-2", "gen-1")
    c.delete(batch_name(2, shard=Shard(1, N)))

    # The adopter takes them and does them: the union holds again.
    c.journals(2, [adopt_event("rb-1", [25, 28], "gen-2", "1/3"),
                   adopt_event(rec.id, [13, 16, 19], "gen-2", "1/3")])
    c.batch(2, 2, [13, 16, 19])
    r = union_report(node)
    assert r.ok, r.problems
    # The same from the node's shell: `fleetdeck-agent verify-union RUN_DIR`.
    cli = subprocess.run([sys.executable, "-m", "agents.cli", "verify-union", str(node)],
                         capture_output=True, text=True, timeout=180, env=os.environ)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "shard 1/3: 4 done, 1 failed of 5 owned, 1 batches, reassigned to gen-3" in cli.stdout
    c.delete(batch_name(2, shard=Shard(2, N)))
    cli = subprocess.run([sys.executable, "-m", "agents.cli", "verify-union", str(node),
                          "--json"], capture_output=True, text=True, timeout=180,
                         env=os.environ)
    assert cli.returncode == 1 and not json.loads(cli.stdout)["ok"]


def test_nothing_to_reassign_and_no_pin_are_refused(tmp_path: Path, s3_env: S3Server) -> None:
    good_campaign(s3_env)
    node = run_dir(tmp_path, s3_env, "2/3")
    with pytest.raises(ReassignRefused, match="nothing left to do in S3"):
        plan_reassign(node, "reassign-s00of03", "0/3", "gen-1", "gen-3")
    other = run_dir(tmp_path, s3_env, "1/4")
    with pytest.raises(ReassignRefused, match="not one of the 3 shards"):
        plan_reassign(other, "reassign-s00of03", "0/3", "gen-1", "gen-3")
