"""`verify` on a real run: S3 against uploads.jsonl (missing, replaced and extra objects,
multipart ETags) and the counts against each other, every problem named; the CLI's exit codes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from boto3.s3.transfer import TransferConfig

from agents.artifacts.verify import _part_sizes, verify_run
from agents.engine.uploader import make_s3_client
from agents.rundir.batchscan import Digests, ranges_text, spans
from agents.rundir.schema import UploadRecord, VerifyReport
from agents.rundir.spec import S3Section
from tests.artifacts.conftest import PROMPTS, MadeRun, batch_indices, own_prefix
from tests.servers.s3 import S3Server

MiB = 1 << 20


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], capture_output=True,
                          text=True, timeout=180, env={**os.environ, **(env or {})})


def _failed(report: VerifyReport) -> dict[str, str]:
    return {c.name: c.detail for c in report.checks if not c.ok}


def test_a_clean_run_passes_and_the_open_batch_counts(run_copy: Path, s3_env: S3Server,
                                                      made_run: MadeRun) -> None:
    report = verify_run(run_copy)
    assert report.ok, report.problems
    c = report.counted
    done = PROMPTS - len(made_run.bad)
    assert (c.done_indices, c.progress_completed, c.current_lines) == (done, done, done)
    assert c.closed_batches == c.s3_objects == c.upload_records == math.ceil(done / 40)
    assert c.open_batch_lines == 0 and c.lines == done
    assert {ch.name for ch in report.checks} >= {"uploads_recorded", "s3_objects_match",
                                                 "s3_listing", "counts"}

    # An open batch: two new indices and a retry of index 0 (attempt 2 supersedes attempt 1),
    # then a torn last line (a write in progress). Current lines = distinct indices.
    comp = run_copy / "completions"
    template = json.loads((comp / "completions_000000.jsonl").read_text().splitlines()[0])
    lines = [{**template, "index": i, "attempt": a} for i, a in ((99, 1), (199, 1), (0, 2))]
    (comp / "completions_000008.jsonl.partial").write_text(
        "".join(json.dumps(x) + "\n" for x in lines) + '{"index": 29')
    with open(comp / ".done_indices", "a") as f:
        f.write("99\n199\n0 2\n")
    report = verify_run(run_copy)
    assert _failed(report).keys() == {"counts"}
    assert f"completed {done} but there are {done + 2} current lines (+2)" in \
        _failed(report)["counts"]
    progress = json.loads((run_copy / "progress.json").read_text())
    progress["completed"] = done + 2
    (run_copy / "progress.json").write_text(json.dumps(progress))
    report = verify_run(run_copy)
    assert report.ok, report.problems
    assert (report.counted.open_batch_lines, report.counted.lines,
            report.counted.current_lines, report.counted.done_records) == \
        (3, done + 3, done + 2, done + 3)


def test_a_missing_and_a_replaced_object_are_named(run_copy: Path, s3_env: S3Server) -> None:
    prefix = own_prefix(run_copy, s3_env, "damaged")
    assert _cli("verify", str(run_copy), env=s3_env.env()).returncode == 0
    client = s3_env.client()
    comp = run_copy / "completions"
    client.delete_object(Bucket=s3_env.bucket, Key=f"{prefix}completions_000002.jsonl")
    client.put_object(Bucket=s3_env.bucket, Key=f"{prefix}completions_000005.jsonl",
                      Body=b'{"index": 1}\n')
    client.put_object(Bucket=s3_env.bucket, Key=f"{prefix}stray.jsonl", Body=b"x")

    r = _cli("verify", str(run_copy), "--json", env=s3_env.env())
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert not report["ok"]
    failed = {c["name"] for c in report["checks"] if not c["ok"]}
    assert failed == {"s3_objects_match", "s3_listing"}
    text = "\n".join(report["problems"])
    # 5 replaced by a put without a checksum (an ordinary client's), where uploads.jsonl
    # says the engine's upload had one.
    for number, what in ((2, "is missing"), (5, "has no SHA-256 checksum, but uploads.jsonl "
                                             "says it was uploaded with one")):
        name = f"completions_{number:06d}.jsonl"
        span = ranges_text(spans(batch_indices(comp / name)), 5)
        assert f"{name} (indices {span}): s3://{s3_env.bucket}/{prefix}{name} {what}" in text
    assert f"s3://{s3_env.bucket}/{prefix}stray.jsonl: under the prefix" in text
    assert report["counted"]["s3_objects"] == report["counted"]["closed_batches"]  # 8 = 7 + 1

    human = _cli("verify", str(run_copy), env=s3_env.env())
    assert human.returncode == 1 and "FAIL  s3_objects_match" in human.stdout
    assert "completions_000002.jsonl" in human.stdout
    nowhere = run_copy.parent / "not-a-run"
    nowhere.mkdir()
    usage = _cli("verify", str(nowhere))
    assert usage.returncode == 2 and "not a run directory" in usage.stderr


def test_counts_that_disagree_name_the_index_range(run_copy: Path, s3_env: S3Server) -> None:
    done_path = run_copy / "completions" / ".done_indices"
    kept = [x for x in done_path.read_text().splitlines() if x not in
            {str(i) for i in range(120, 125)}]
    kept += [str(i) for i in range(5000, 5010)]
    done_path.write_text("\n".join(kept) + "\n")
    report = verify_run(run_copy)
    assert not report.ok
    detail = {c.name: c.detail for c in report.checks}
    assert "records indices 5000-5009 that have no batch line" in \
        detail["done_indices_match_lines"]
    holders = ", ".join(p.name for p in sorted((run_copy / "completions").glob("*.jsonl"))
                        if set(batch_indices(p)) & set(range(120, 125)))
    assert f"batch lines for indices 120-124 in {holders} are not recorded" in \
        detail["done_indices_match_lines"]
    assert "302 distinct indices in .done_indices but 297 current lines" in detail["counts"]
    assert "hold indices 5000-5009 beyond the prompts file (300 lines" in \
        detail["indices_in_range"]
    assert {c.name for c in report.checks if not c.ok} == {"done_indices_match_lines", "counts",
                                                           "indices_in_range"}


def test_a_training_run_has_nothing_to_verify(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text('[run]\nname = "drafter"\nkind = "train"\n')
    report = verify_run(tmp_path)
    assert report.ok and [c.name for c in report.checks] == ["kind"]


def test_multipart_etags_use_the_objects_part_size(run_copy: Path, s3_env: S3Server) -> None:
    # A `retry truncated` batch of long answers (attempt 2 of indices already done), 11 MiB,
    # uploaded in 5 MiB parts: ETag `<md5 of part md5s>-3`.
    prefix = own_prefix(run_copy, s3_env, "multipart")
    comp = run_copy / "completions"
    template = json.loads((comp / "completions_000000.jsonl").read_text().splitlines()[0])
    template["content"] = "y" * 40_000
    done = sorted({int(x) for x in (comp / ".done_indices").read_text().split()})
    big = comp / "completions_000008.jsonl"
    retried: list[int] = []
    with open(big, "w") as f:
        while f.tell() < 11 * MiB:
            retried.append(done[len(retried)])
            f.write(json.dumps({**template, "index": retried[-1], "attempt": 2}) + "\n")
    with open(comp / ".done_indices", "a") as f:
        f.write("".join(f"{i} 2\n" for i in retried))
    client = s3_env.client()
    key = f"{prefix}{big.name}"
    client.upload_file(str(big), s3_env.bucket, key, Config=TransferConfig(
        multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB))
    etag = client.head_object(Bucket=s3_env.bucket, Key=key)["ETag"].strip('"')
    assert etag.endswith("-3")
    data = big.read_bytes()
    with open(run_copy / "uploads.jsonl", "a") as f:
        f.write(json.dumps({"batch": big.name, "size": len(data), "key": key, "etag": etag,
                            "sha256": hashlib.sha256(data).hexdigest(),
                            "bucket": s3_env.bucket, "uploaded_at": time.time()}) + "\n")

    report = verify_run(run_copy)
    assert report.ok, report.problems
    # The part size came from S3 (the length of part 1), not from a guess.
    rec = json.loads((run_copy / "uploads.jsonl").read_text().splitlines()[-1])
    s3 = make_s3_client(S3Section(bucket=s3_env.bucket, endpoint_url=s3_env.endpoint_url))
    assert _part_sizes(s3, UploadRecord(**rec), 3) == [5 * MiB]
    d = Digests([5 * MiB, 8 * MiB])
    d.update(data)
    assert d.multipart_etags()[5 * MiB] == etag != d.multipart_etags()[8 * MiB]

    # The same size, other bytes in the local file: named, by batch and index range.
    with open(big, "r+b") as f:
        f.seek(6 * MiB)
        f.write(b"Y")
    report = verify_run(run_copy)
    assert {c.name for c in report.checks if not c.ok} == {"local_batches_match_records"}
    span = ranges_text(spans(retried), 5)
    assert f"{big.name} (indices {span}): the local file" in report.problems[0]
