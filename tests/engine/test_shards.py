"""Shards of a campaign (issue 15, item 1): K/N owns i % N == K of the full prompts file,
names its batches and S3 keys with its tag, pins its shard, and moves indices only through
journaled cedes and adopts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from agents.engine.moves import cede_offline
from agents.engine.ownership import Ownership, adopt_event, cede_event, expand, to_ranges
from agents.rundir.batchnames import ANY, batch_name, in_shard, parse_batch_name
from agents.rundir.shard import Shard, parse_shard, partition_problem
from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.servers.s3 import S3Server


def test_shard_text_tags_and_counts() -> None:
    s = parse_shard("3/8", "x")
    assert (s.k, s.n, s.tag, s.text) == (3, 8, "s03of08", "3/8")
    assert [i for i in range(30) if s.owns(i)] == [3, 11, 19, 27]
    assert s.count(30) == 4 and s.count(3) == 0 and s.count(4) == 1
    assert Shard(7, 128).tag == "s007of128"
    for bad in ("9/8", "8/8", "-1/8", "3", "a/b", "3/0", 3):
        with pytest.raises(ValueError, match="where: shard"):
            parse_shard(bad, "where")


def test_partition_names_overlap_gap_and_mixed_n() -> None:
    assert partition_problem([(f"n{k}", Shard(k, 3)) for k in range(3)]) is None
    twice = partition_problem([("a", Shard(2, 8)), ("b", Shard(2, 8))])
    assert twice is not None and "a and b are both 2/8" in twice
    gap = partition_problem([("a", Shard(0, 3)), ("b", Shard(2, 3))])
    assert gap is not None and "no node has 1/3" in gap
    mixed = partition_problem([("a", Shard(0, 2)), ("b", Shard(1, 3))])
    assert mixed is not None and "do not agree on N" in mixed


def test_batch_names_carry_the_shard_and_filter_by_it() -> None:
    s = Shard(3, 8)
    name = batch_name(123, shard=s)
    assert name == "completions_s03of08_000123.jsonl"
    assert parse_batch_name(name + ".partial") == parse_batch_name(name).__class__(123, True, s)
    plain = batch_name(5)
    assert in_shard(name, s) and not in_shard(name, Shard(2, 8)) and not in_shard(name, None)
    assert in_shard(plain, None) and not in_shard(plain, s)
    assert in_shard(name, ANY) and in_shard(plain, ANY)
    # A tag that does not round-trip is no batch at all (never counted as some shard's).
    assert parse_batch_name("completions_s3of08_000001.jsonl") is None
    assert parse_batch_name("completions_s09of08_000001.jsonl") is None


def test_ranges_round_trip_and_ownership_moves() -> None:
    idx = [3, 11, 19, 27, 35, 4, 100, 101, 102]
    assert sorted(expand(to_ranges(idx))) == sorted(idx)
    assert to_ranges(range(3, 800, 8)) == [(3, 796, 8)]  # the last index is 795
    own = Ownership(Shard(1, 4))
    own.apply(cede_event("c1", [9, 13]))
    assert not own.owns(9) and own.owns(5) and not own.owns(2)
    own.apply(adopt_event("a1", [2, 6], "n2", "2/4"))
    assert own.owns(2) and own.owns(6) and own.count(16) == 4 - 2 + 2
    own.apply(cede_event("c2", [6]))  # an adopted index ceded on: gone again
    assert not own.owns(6) and own.count(16) == 3
    own.apply(adopt_event("a2", [9], None, None))  # a ceded index taken back
    assert own.owns(9) and own.count(16) == 4
    own.apply(cede_event("c1", [5]))  # the same id again changes nothing
    assert own.owns(5)
    assert list(own.owned_descending(16)) == [9, 5, 2, 1]


def _shard_spec(root: Path, prompts: Path, url: str, s3: S3Server, shard: str,
                batch_size: int = 40) -> Path:
    folder = root / shard.replace("/", "of")
    folder.mkdir()
    return write_spec(folder / "run.toml", prompts, [url], s3=s3, batch_size=batch_size,
                      shard=shard)


def test_two_shards_cover_the_prompt_set_once(tmp_path: Path, sims, s3: S3Server) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300)
    sim = sims("--seed", 4)
    specs = [_shard_spec(tmp_path, prompts, sim.url, s3, f"{k}/2") for k in range(2)]
    engines = [start_engine(spec, env=s3.env(), tag=str(k)) for k, spec in enumerate(specs)]
    for e in engines:
        assert e.wait(300) == 0, e.stderr()[-3000:]
    seen: dict[int, str] = {}
    for k, e in enumerate(engines):
        shard = Shard(k, 2)
        progress = json.loads((e.run_dir / "progress.json").read_text())
        assert progress["shard"] == shard.text and progress["total"] == 150
        assert progress["completed"] == 150 and progress["failed"] == 0
        assert json.loads((e.run_dir / "run.pin.json").read_text())["shard"] == shard.text
        names = sorted(p.name for p in (e.run_dir / "completions").glob("completions_*"))
        assert names and all(n.startswith(f"completions_{shard.tag}_") for n in names)
        for path in (e.run_dir / "completions").glob("completions_*.jsonl"):
            for raw in path.read_text().splitlines():
                index = json.loads(raw)["index"]
                assert shard.owns(index), f"{path.name} holds index {index}"
                assert index not in seen, f"index {index} in {seen.get(index)} and {path.name}"
                seen[index] = path.name
    assert sorted(seen) == list(range(300))
    client = s3.client()
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=s3.bucket, Prefix="runs/test/") for o in page.get("Contents", [])]
    batches = [k for k in keys if "/journals/" not in k]
    assert {k.split("_")[1] for k in batches} == {"s00of02", "s01of02"}
    for tag in ("s00of02", "s01of02"):
        assert f"runs/test/journals/{tag}/ownership.jsonl" in keys
        assert f"runs/test/journals/{tag}/failures.jsonl" in keys
    # Each shard verifies on its own against the shared prefix (the other's keys not extra).
    for e in engines:
        r = subprocess.run([sys.executable, "-m", "agents.cli", "verify", str(e.run_dir)],
                           capture_output=True, text=True, env=s3.env(), timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
    # A resume may not change the shard its run dir is pinned to.
    spec = specs[0]
    spec.write_text(spec.read_text().replace('shard = "0/2"', 'shard = "1/2"'))
    again = start_engine(spec, env=s3.env(), tag="again")
    assert again.wait(300) != 0
    assert "[generate] shard is '1/2' but the run was pinned with '0/2'" in again.stderr()


def test_a_refused_resume_says_failed_not_the_last_engines_status(tmp_path: Path, sims,
                                                                   s3: S3Server) -> None:
    """When the supervisor's next engine refuses to start (here: the prompts file changed
    under a pinned shard), status is failed with the reason, not the last engine's `done`."""
    import os

    from tests.plugins.supervised import agent, kill_run, wait_status

    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 40)
    sim = sims("--seed", 5)
    spec = _shard_spec(tmp_path, prompts, sim.url, s3, "1/2")
    run_dir = spec.parent / "run"
    env = {**os.environ, **s3.env()}
    up = subprocess.run([sys.executable, "-m", "agents.cli", "up", str(spec)],
                        capture_output=True, text=True, env=env, timeout=180)
    assert up.returncode == 0, up.stderr
    try:
        wait_status(run_dir, lambda s: s["status"] == "done", 120, "shard 1/2 done")
        with open(prompts, "a") as f:
            f.write('{"messages": [{"role": "user", "content": "one more"}]}\n')
        agent("resume", str(run_dir))
        snap = wait_status(run_dir, lambda s: s["status"] != "done", 120, "the refusal")
        assert snap["status"] == "failed", snap
        assert "the prompts file changed" in (snap["message"] or "")
    finally:
        agent("down", str(run_dir), "--yes")
        kill_run(run_dir)


@pytest.mark.parametrize(("check_s", "batch_size"), [
    ("0.3", 40),  # the engine's own check finds it
    ("600", 5),  # no check for ten minutes: the uploader's look before its next put does
])
def test_a_running_shard_stops_when_it_is_reassigned(tmp_path: Path, sims, s3: S3Server,
                                                     check_s: str, batch_size: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A node cut off from the console (a network split) and reassigned while it runs stops
    at its next check, or at its next put to S3 (which looks for the record first): it sends
    and uploads nothing more, and says why."""
    import time

    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 400)
    sim = sims("--seed", 6, "--time-scale", "1")  # answers take seconds: the run is live
    spec = _shard_spec(tmp_path, prompts, sim.url, s3, "0/2", batch_size)
    engine = start_engine(spec, env={**s3.env(), "FLEETDECK_REASSIGN_CHECK_S": check_s})
    try:
        from tests.engine.runs import wait_progress

        wait_progress(engine, lambda p: p["status"] == "running" and p["in_flight"] > 0, 120,
                      "requests in flight")
        record = {"id": "reassign-s00of02", "shard": "0/2", "node": "gen-1", "to": "gen-2",
                  "time": time.time(), "count": 1, "ranges": [[0, 1, 1]]}
        s3.client().put_object(Bucket=s3.bucket, Key="runs/test/journals/reassign/"
                               "reassign-s00of02.json", Body=json.dumps(record).encode())
        said, said_at = time.monotonic(), time.time()
        assert engine.wait(300) != 0
        took = time.monotonic() - said
    finally:
        engine.kill()
    progress = json.loads((engine.run_dir / "progress.json").read_text())
    assert progress["status"] == "failed"
    assert "shard 0/2 was reassigned from gen-1 to gen-2" in progress["message"]
    assert progress["completed"] < 200
    # Long before a ten-minute check could have found it, however loaded the machine.
    assert took < 300, f"took {took:.1f} s to stop"
    uploaded = [k["Key"] for k in s3.client().list_objects_v2(
        Bucket=s3.bucket, Prefix="runs/test/completions_").get("Contents", [])]
    assert len(uploaded) <= progress["s3_uploaded"], "a batch went up after the stop"
    # At most the put already under way when the record landed finished after it.
    ups = [json.loads(x) for x in (engine.run_dir / "uploads.jsonl").read_text().splitlines()]
    assert sum(u["uploaded_at"] > said_at for u in ups) <= 1, ups
    # Nor do its journals, after a move made with no engine running (fenced the same way):
    # the cede is on disk, S3 keeps what it had.
    key = "runs/test/journals/s00of02/ownership.jsonl"

    def in_s3() -> bytes:
        try:
            return s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        except ClientError:
            return b""

    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # the agent's S3 keys, as on the node
    before = in_s3()
    ev, why = cede_offline(engine.run_dir, "late", 3)
    assert ev.count == 3 and why is not None and "was reassigned" in why, why
    assert b'"late"' in (engine.run_dir / "ownership.jsonl").read_bytes()
    assert in_s3() == before
