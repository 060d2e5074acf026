"""The engine end to end: real processes, the SGLang simulator as servers, real S3."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import httpx

from tests.engine.runs import read_run, start_engine, wait_progress, write_prompts, write_spec
from tests.servers.s3 import S3Server


def _s3_objects(s3: S3Server) -> dict[str, dict]:
    client = s3.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket,
                                                                 Prefix="runs/test/"):
        for obj in page.get("Contents", []):
            if not obj["Key"].startswith("runs/test/journals/"):  # the pin and failures
                out[obj["Key"]] = obj
    return out


def _check_s3_matches(run_dir: Path, s3: S3Server) -> int:
    uploads = [json.loads(x) for x in (run_dir / "uploads.jsonl").read_text().splitlines()]
    closed = sorted(p.name for p in (run_dir / "completions").glob("*.jsonl"))
    assert sorted(u["batch"] for u in uploads) == closed, "a closed batch is not in uploads"
    objects = _s3_objects(s3)
    client = s3.client()
    for u in uploads:
        local = (run_dir / "completions" / u["batch"]).read_bytes()
        assert u["sha256"] == hashlib.sha256(local).hexdigest()
        head = client.head_object(Bucket=s3.bucket, Key=u["key"], ChecksumMode="ENABLED")
        assert head["ETag"].strip('"') == hashlib.md5(local).hexdigest() == u["etag"]
        assert head["ContentLength"] == len(local) == u["size"]
        # The SHA-256 S3 checked at the put, and kept: what the upload was confirmed by.
        assert u["checksum"] == "sha256"
        assert base64.b64decode(head["ChecksumSHA256"]).hex() == u["sha256"]
    assert set(objects) == {u["key"] for u in uploads}
    return len(uploads)


def test_three_servers_one_flaky_one_crashing(tmp_path: Path, sims, s3: S3Server) -> None:
    steady = sims("--seed", 1)
    flaky = sims("--seed", 2, "--error-rate", 0.02)
    crashing = sims("--seed", 3, "--crash-after-requests", 150)
    prompts = tmp_path / "prompts.jsonl"
    bad = write_prompts(prompts, 2000, bad_every=250)
    spec = write_spec(tmp_path / "run.toml", prompts, [steady.url, flaky.url, crashing.url],
                      s3=s3, batch_size=100, retries=4)
    engine = start_engine(spec, env=s3.env())
    assert engine.wait(300) == 0, engine.stderr()
    assert crashing.proc.wait(timeout=60) is not None  # it really died mid-run
    st = read_run(engine.run_dir)
    progress = json.loads((engine.run_dir / "progress.json").read_text())
    assert progress["status"] == "done"
    # Invariant 1: every index in exactly one state, and nothing left to do.
    assert st.todo == set()
    assert bad <= st.failed
    assert progress["completed"] == len(st.current) == st.lines
    assert progress["failed"] == len(st.failed)
    assert progress["bad_input"] == len(bad)
    assert progress["total"] == 2000 == len(st.current) + len(st.failed)
    # The crashed server's work went elsewhere; the flaky server's 500s were retried.
    assert progress["servers"]["2"]["state"] == "down"
    assert progress["retried"] > 0
    assert len(st.failed - bad) <= 5, "retries should absorb a 2% error rate"
    # Invariant 2: every closed batch is in S3 with a matching ETag.
    n = _check_s3_matches(engine.run_dir, s3)
    assert n == progress["s3_uploaded"] == progress["batches_closed"]
    assert progress["s3_pending"] == 0
    # A run outside a campaign moves no index: no ownership journal, nothing in S3 for one;
    # its pin and failures.jsonl are there, what resume-from-s3 rebuilds a lost disk from.
    assert not (engine.run_dir / "ownership.jsonl").exists()
    journals = {o["Key"]: o for o in s3.client().list_objects_v2(
        Bucket=s3.bucket, Prefix="runs/test/journals/")["Contents"]}
    assert set(journals) == {"runs/test/journals/run/run.pin.json",
                             "runs/test/journals/run/failures.jsonl"}
    body = s3.client().get_object(Bucket=s3.bucket, Key="runs/test/journals/run/failures.jsonl")
    assert body["Body"].read() == (engine.run_dir / "failures.jsonl").read_bytes()
    pin = json.loads(s3.client().get_object(
        Bucket=s3.bucket, Key="runs/test/journals/run/run.pin.json")["Body"].read())
    assert pin == json.loads((engine.run_dir / "run.pin.json").read_text())
    assert progress["queue"] is None and progress["campaign"] is None
    sizes = [len(p.read_text().splitlines())
             for p in sorted((engine.run_dir / "completions").glob("*.jsonl"))]
    assert all(s == 100 for s in sizes[:-1]) and 0 < sizes[-1] <= 100
    # The batch line carries what a trainer needs.
    line = st.current[0]
    assert line["messages"][-1]["role"] == "user"
    assert line["finish_reason"] in ("stop", "length", "tool_calls")
    assert line["usage"]["completion_tokens"] > 0 and line["spec_verify_ct"] > 0
    assert line["sampling"] == {"temperature": 0.6, "top_p": 0.95}
    one = st.current[1]
    assert one["id"] == "p1" and [m["role"] for m in one["messages"]] == ["system", "user"]


def test_bad_spec_fails_before_any_request(tmp_path: Path, sims) -> None:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 10)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_szie=3)
    engine = start_engine(spec)
    assert engine.wait(300) == 2
    assert "unknown field `batch_szie`" in engine.stderr() and str(spec) in engine.stderr()
    # Unreachable S3: refused at start, naming the bucket, with nothing sent.
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url])
    spec.write_text(spec.read_text() + '\n[s3]\nbucket = "nowhere"\n'
                    'endpoint_url = "http://127.0.0.1:9"\nregion = "us-east-1"\n')
    engine = start_engine(spec, env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"})
    assert engine.wait(300) == 2
    assert "[s3] bucket 'nowhere'" in engine.stderr()
    state = httpx.get(f"{sim.url}/sim/state", timeout=60).json()
    assert state["requests_total"] == 0


def test_changed_prompts_file_is_refused_on_resume(tmp_path: Path, sims) -> None:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 30)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url])
    assert start_engine(spec).wait(300) == 0
    write_prompts(prompts, 31)
    engine = start_engine(spec)
    assert engine.wait(300) == 2
    assert "prompts file changed" in engine.stderr()
    assert str(prompts) in engine.stderr()


def test_sigterm_drains_and_a_second_run_resumes(tmp_path: Path, sims) -> None:
    sim = sims("--time-scale", "0.2")
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 400)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], batch_size=40)
    engine = start_engine(spec)
    wait_progress(engine, lambda p: p["completed"] >= 30, 120, "first completions")
    engine.proc.terminate()
    assert engine.wait(300) == 0, engine.stderr()
    first = json.loads((engine.run_dir / "progress.json").read_text())
    assert first["status"] == "stopped" and first["in_flight"] == 0
    st = read_run(engine.run_dir)
    assert not list((engine.run_dir / "completions").glob("*.partial")), "open batch left"
    assert 30 <= len(st.current) < 400
    sim2 = sims()
    spec = write_spec(tmp_path / "run.toml", prompts, [sim2.url], batch_size=40)
    again = start_engine(spec)
    assert again.wait(300) == 0, again.stderr()
    st = read_run(again.run_dir)
    assert st.todo == set() and len(st.current) == 400
    # Batch numbering continued after the short batch closed at stop.
    assert st.batch_numbers == list(range(len(st.batch_numbers)))
