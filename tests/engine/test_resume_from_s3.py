"""A run whose node disk is lost, resumed on another from its S3 prefix (`resume-from-s3`):
real processes (the engine, the supervisor, the console's `serve --stdio`), the SGLang
simulator and SeaweedFS. The batches in S3 are never rewritten, the new ones are numbered
after them, every index ends exactly once across S3's batches, failed indices stay failed."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agents.cli import main as agent_main
from tests.engine.runs import read_run, start_engine, wait_progress, write_prompts, write_spec
from tests.plugins.supervised import agent, kill_run
from tests.servers.ports import wait_until
from tests.servers.s3 import S3Server

PREFIX = "runs/test/"
FAILURES = f"{PREFIX}journals/run/failures.jsonl"
ENV = {"FLEETDECK_JOURNAL_INTERVAL_S": "0.2"}  # S3's failures.jsonl close behind the disk's


def batch_objects(s3: S3Server) -> dict[str, dict[str, Any]]:
    """The batch objects directly under the prefix, by key: ETag, LastModified, size."""
    out = {}
    client = s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=s3.bucket, Prefix=PREFIX, Delimiter="/"):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = {"etag": obj["ETag"], "modified": obj["LastModified"],
                               "size": obj["Size"]}
    return out


def lines_per_index(s3: S3Server, keys: list[str]) -> Counter[int]:
    counts: Counter[int] = Counter()
    client = s3.client()
    for key in keys:
        body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        counts.update(json.loads(raw)["index"] for raw in body.splitlines() if raw.strip())
    return counts


def failed_in(data: bytes) -> set[int]:
    last: dict[int, str] = {}
    for raw in data.splitlines():
        ev = json.loads(raw)
        if ev.get("index") is not None:
            last[ev["index"]] = ev["event"]
    return {i for i, ev in last.items() if ev == "failed"}


def s3_failures(s3: S3Server) -> bytes:
    data: bytes = s3.client().get_object(Bucket=s3.bucket, Key=FAILURES)["Body"].read()
    return data


def number(key: str) -> int:
    return int(key.rsplit("_", 1)[1].split(".")[0])


def test_a_lost_disk_is_resumed_from_s3_sending_only_what_s3_lacks(
        tmp_path: Path, sims, s3: S3Server) -> None:
    # Bad lines (failed, bad_input) and a server that answers 500 now and then with no
    # retry (failed, http_500): failures the run must keep.
    sim = sims("--time-scale", "0.03", "--error-rate", "0.03", "--seed", 5)
    prompts = tmp_path / "prompts.jsonl"
    total = 1200
    bad = write_prompts(prompts, total, bad_every=97)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], s3=s3, batch_size=50,
                      retries=1, concurrency_per_server=8)
    first = start_engine(spec, env={**s3.env(), **ENV})
    try:
        wait_progress(first, lambda p: p["s3_uploaded"] >= 4 and p["failed"] >= 3, 120,
                      "four batches confirmed in S3 and failures journaled")
        wait_until(lambda: len(failed_in(s3_failures(s3))) >= 3, 120,
                   "failures.jsonl in S3 holding the failures")
    finally:
        first.kill()  # the machine is gone: no drain, no last upload
    before = batch_objects(s3)
    failed_before = failed_in(s3_failures(s3))
    assert 4 <= len(before) < total // 50, "the run must stop part way"
    assert failed_before & bad, "bad_input failures are among those kept"
    shutil.rmtree(first.run_dir)  # the disk, lost

    # A console resumes it on "another machine": a local node, the agent as a subprocess.
    agent_cmd = " ".join(["env", *(f"{k}={v}" for k, v in {**s3.env(), **ENV}.items()),
                          sys.executable, "-m", "agents.cli"])
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'[[nodes]]\nname = "gen-1"\nlocal = true\nrun_dir = "{first.run_dir}"\n'
                     f'spec = "{spec}"\nagent = "{agent_cmd}"\n')
    try:
        fd = [sys.executable, "-m", "console.cli", "--fleet", str(fleet)]
        r = subprocess.run([*fd, "resume-from-s3", "gen-1"], capture_output=True, text=True,
                           timeout=180)
        assert r.returncode == 2 and "add --yes" in r.stderr, r.stderr  # dangerous
        assert not first.run_dir.exists()
        r = subprocess.run([*fd, "resume-from-s3", "gen-1", "--yes"], capture_output=True,
                           text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        restored = json.loads(r.stdout)
        assert restored["batches"] == len(before)
        assert restored["next_batch"] == max(number(k) for k in before) + 1
        assert restored["failed"] == len(failed_before), restored
        assert restored["failures_in_s3"] and restored["supervisor_pid"]

        def finished() -> bool:
            try:
                return json.loads((first.run_dir / "progress.json").read_text())["status"] \
                    == "done"
            except (FileNotFoundError, ValueError):
                return False

        wait_until(finished, 120, "the resumed run finishes")
        # A second resume-from-s3 on the run it rebuilt is refused: `resume` is for that.
        again = subprocess.run([*fd, "resume-from-s3", "gen-1", "--yes"], capture_output=True,
                               text=True, timeout=180)
        assert again.returncode == 1 and "use resume" in again.stderr, again.stderr
        v = subprocess.run([*fd, "verify", "gen-1"], capture_output=True, text=True,
                           timeout=180)
        assert v.returncode == 0 and json.loads(v.stdout)["ok"], v.stdout + v.stderr
    finally:
        if (first.run_dir / "supervisor.pid").exists():
            agent("down", str(first.run_dir), "--yes")
        kill_run(first.run_dir)

    after = batch_objects(s3)
    # Nothing in S3 was rewritten; the new batches come after the old ones.
    for key, obj in before.items():
        assert after[key] == obj, f"{key} changed: {obj} -> {after[key]}"
    new = sorted(set(after) - set(before))
    assert new and min(number(k) for k in new) > max(number(k) for k in before)
    # Every index exactly once across S3's batches, but the failed ones: none.
    counts = lines_per_index(s3, sorted(after))
    failed_now = failed_in((first.run_dir / "failures.jsonl").read_bytes())
    assert failed_before <= failed_now
    assert not failed_now & set(counts), "a failed index has a line"
    assert set(counts) | failed_now == set(range(total))
    assert all(n == 1 for n in counts.values()), [i for i, n in counts.items() if n > 1][:10]
    # The failures S3 held were not sent again: one `failed` event each, the restored one.
    events = Counter(json.loads(raw)["index"] for raw in
                     (first.run_dir / "failures.jsonl").read_bytes().splitlines()
                     if json.loads(raw).get("event") == "failed")
    assert all(events[i] == 1 for i in failed_before), "a failed index was sent again"
    # The rebuilt run directory is whole by the run's own rules too.
    st = read_run(first.run_dir)
    assert st.todo == set() and st.failed == failed_now
    assert set(st.batch_numbers) == {number(k) for k in after}


def _cli(*args: str) -> int:
    return agent_main(list(args))


@pytest.fixture
def finished_run(tmp_path: Path, sims, s3: S3Server, monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[Path, Path]:
    """A small run finished into S3, then its run directory deleted: (spec, prompts)."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 60)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], s3=s3, batch_size=20)
    engine = start_engine(spec, env=s3.env())
    assert engine.wait(120) == 0, engine.stderr()
    return spec, prompts


def test_resume_from_s3_refuses_what_it_cannot_do_safely(
        finished_run: tuple[Path, Path], s3: S3Server, capsys: pytest.CaptureFixture[str]
        ) -> None:
    spec, prompts = finished_run
    run_dir = spec.parent / "run"
    # The run directory is still here: `resume` is for that.
    assert _cli("resume-from-s3", str(spec)) == 2
    err = capsys.readouterr().err
    assert f"{run_dir}: holds a run" in err and "use" in err and "`resume`" in err
    shutil.rmtree(run_dir)

    # Another prompts file at the same path: refused, naming the file and both sha256s.
    pinned = json.loads(s3.client().get_object(
        Bucket=s3.bucket, Key=f"{PREFIX}journals/run/run.pin.json")["Body"].read())
    original = prompts.read_bytes()
    prompts.write_bytes(original.replace(b"Task 0:", b"Task 0 changed:", 1))
    now = hashlib.sha256(prompts.read_bytes()).hexdigest()
    assert _cli("resume-from-s3", str(spec)) == 2
    err = capsys.readouterr().err
    assert str(prompts) in err and now in err and pinned["prompts_sha256"] in err, err
    assert not run_dir.exists(), "a refusal writes nothing"
    prompts.write_bytes(original)

    # No [s3] in the spec.
    plain = spec.with_name("plain.toml")
    plain.write_text(spec.read_text().split("[s3]")[0])
    assert _cli("resume-from-s3", str(plain)) == 2
    assert "no [s3]" in capsys.readouterr().err

    # A prefix that holds no pin (another prefix, or a run from before pins went up).
    other = spec.with_name("other.toml")
    other.write_text(spec.read_text().replace('prefix = "runs/test/"',
                                              'prefix = "runs/nothing-here/"'))
    assert _cli("resume-from-s3", str(other)) == 2
    err = capsys.readouterr().err
    assert "s3://" in err and "runs/nothing-here/journals/run/run.pin.json: no pin" in err
    assert not run_dir.exists()


def test_failures_are_restored_and_retry_failed_sends_them_again(
        tmp_path: Path, sims, s3: S3Server, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in {**s3.env(), **ENV}.items():
        monkeypatch.setenv(k, v)
    sim = sims("--error-rate", "0.1", "--seed", 3)
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 80)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], s3=s3, batch_size=20,
                      retries=1)
    engine = start_engine(spec, env={**s3.env(), **ENV})
    assert engine.wait(120) == 0, engine.stderr()
    failed = failed_in(s3_failures(s3))
    assert failed, "a 10% error rate with no retry fails some"
    shutil.rmtree(engine.run_dir)
    # The failures come back from S3 (nothing started yet: the rebuilt directory alone).
    from agents.artifacts.restore import restore_run_dir
    from agents.rundir.spec import load_spec

    restored = restore_run_dir(load_spec(spec))
    assert restored.failed == len(failed) and restored.done == 80 - len(failed)
    assert (engine.run_dir / "failures.jsonl").read_bytes() == s3_failures(s3)
    shutil.rmtree(engine.run_dir)
    # --retry-failed: the run starts with them requeued; the healthy server answers them.
    sim.proc.kill()
    healthy = sims("--seed", 4)
    spec.write_text(spec.read_text().replace(sim.url, healthy.url))
    try:
        assert _cli("resume-from-s3", str(spec), "--retry-failed") == 0
        out = json.loads(capsys.readouterr().out)
        assert out["retry_failed"] and out["failed"] == len(failed)

        def finished() -> bool:
            try:
                p = json.loads((engine.run_dir / "progress.json").read_text())
            except (FileNotFoundError, ValueError):
                return False
            return bool(p["status"] == "done")

        wait_until(finished, 120, "the resumed run finishes")
    finally:
        if (engine.run_dir / "supervisor.pid").exists():
            agent("down", str(engine.run_dir), "--yes")
        kill_run(engine.run_dir)
    counts = lines_per_index(s3, sorted(batch_objects(s3)))
    assert set(counts) == set(range(80)) and all(n == 1 for n in counts.values())
    st = read_run(engine.run_dir)
    assert st.failed == set() and st.todo == set()


def test_a_batch_key_that_holds_other_bytes_is_never_overwritten(
        tmp_path: Path, s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The put carries If-None-Match: * (SeaweedFS 4.48 answers 412 to it): a key that holds
    our own bytes (a put whose record a crash took) is recorded; other bytes are an error
    naming the key, and the object stays as it was."""
    from agents.engine.uploader import Conflict, Pending, Uploader
    from agents.rundir.spec import S3Section

    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    section = S3Section(bucket=s3.bucket, prefix=PREFIX, endpoint_url=s3.endpoint_url,
                        region="us-east-1")
    (tmp_path / "completions").mkdir()
    ours, theirs = (tmp_path / "completions" / f"completions_00000{n}.jsonl" for n in (0, 1))
    ours.write_bytes(b'{"index": 0}\n')
    theirs.write_bytes(b'{"index": 1}\n')
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key=f"{PREFIX}{ours.name}", Body=ours.read_bytes())
    client.put_object(Bucket=s3.bucket, Key=f"{PREFIX}{theirs.name}", Body=b'{"index": 7}\n')
    kept = client.head_object(Bucket=s3.bucket, Key=f"{PREFIX}{theirs.name}")
    up = Uploader(section, tmp_path)
    up.recover([])
    try:
        assert up._upload(Pending(ours)).batch == ours.name
        with pytest.raises(Conflict) as exc:
            up._upload(Pending(theirs))
        assert f"s3://{s3.bucket}/{PREFIX}{theirs.name} already exists" in str(exc.value)
        assert "never overwritten" in str(exc.value)
    finally:
        up.close()
    now = client.head_object(Bucket=s3.bucket, Key=f"{PREFIX}{theirs.name}")
    assert (now["ETag"], now["LastModified"]) == (kept["ETag"], kept["LastModified"])
    assert client.get_object(Bucket=s3.bucket, Key=f"{PREFIX}{theirs.name}")["Body"].read() \
        == b'{"index": 7}\n'
    records = (tmp_path / "uploads.jsonl").read_text().splitlines()
    assert [json.loads(r)["batch"] for r in records] == [ours.name]
