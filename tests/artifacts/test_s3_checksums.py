"""S3 integrity that does not lean on ETag = MD5: uploads carry a SHA-256 that S3 checks and
keeps, and the engine, verify and the decommission gate judge objects by it. Against a real
SeaweedFS behind a proxy that answers ETags as AWS does under SSE-KMS (not the MD5):
SeaweedFS's own SSE-KMS keeps ETag = MD5 (tests/servers/etag_proxy.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.artifacts.verify import verify_run
from agents.engine.uploader import confirm, sha256_b64
from agents.rundir.batchscan import ranges_text, spans
from console.artifacts.decommission import checklist, pull_node
from console.fleet import Node
from console.transport import AgentLink
from tests.artifacts.conftest import MadeRun, batch_indices, own_prefix
from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.servers.etag_proxy import EtagProxy, kms_etag, start_etag_proxy
from tests.servers.ports import kill_pid
from tests.servers.s3 import S3Server
from tests.simserver import FAST_ARGS, start_sim

PROMPTS = 200
BATCH_SIZE = 30
PREFIX = "runs/kms/"


@dataclass
class KmsRun:
    run_dir: Path
    proxy: EtagProxy
    s3: S3Server
    log: str


@pytest.fixture(scope="module")
def kms_run(tmp_path_factory: pytest.TempPathFactory, shared_s3: S3Server) -> Iterator[KmsRun]:
    """A real engine run whose S3 endpoint is the proxy: every ETag it sees is not the MD5."""
    root = tmp_path_factory.mktemp("kms")
    proxy = start_etag_proxy(shared_s3.endpoint_url)
    try:
        (root / "sim").mkdir()
        sim = start_sim(root / "sim", *FAST_ARGS, "--seed", "11")
        try:
            prompts = root / "prompts.jsonl"
            write_prompts(prompts, PROMPTS)
            endpoint = SimpleNamespace(bucket=shared_s3.bucket, endpoint_url=proxy.url)
            spec = write_spec(root / "run.toml", prompts, [sim.url], s3=endpoint,
                              batch_size=BATCH_SIZE)
            spec.write_text(spec.read_text().replace('prefix = "runs/test/"',
                                                     f'prefix = "{PREFIX}"'))
            engine = start_engine(spec, env=shared_s3.env())
            # An engine that re-queues good uploads for ever ends only at its drain timeout.
            assert engine.wait(300) == 0, engine.stderr()
        finally:
            kill_pid(sim.proc)
        yield KmsRun(engine.run_dir, proxy, shared_s3, engine.stderr())
    finally:
        proxy.close()


def _records(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (run_dir / "uploads.jsonl").read_text().splitlines()]


def _copy(kms_run: KmsRun, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(kms_run.run_dir, dest, symlinks=True)
    return dest


def test_an_engine_behind_sse_kms_etags_confirms_each_batch_once(
        kms_run: KmsRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = kms_run.run_dir
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["status"] == "done" and progress["s3_pending"] == 0, progress
    closed = sorted((run_dir / "completions").glob("completions_*.jsonl"))
    assert len(closed) == -(-PROMPTS // BATCH_SIZE)
    records = _records(run_dir)
    assert sorted(str(r["batch"]) for r in records) == [p.name for p in closed]
    for rec in records:
        local = (run_dir / "completions" / str(rec["batch"])).read_bytes()
        md5 = hashlib.md5(local).hexdigest()
        # What the engine saw really was not the MD5 (the proxy is in the path), and it was
        # confirmed by the SHA-256 S3 keeps instead.
        assert rec["etag"] == kms_etag(md5) != md5
        assert rec["checksum"] == "sha256" and rec["sha256"] == hashlib.sha256(local).hexdigest()
    # Each batch put once: no retry of a good upload, as S3 saw it and as the log says.
    batch_puts = {k: n for k, n in kms_run.proxy.puts.items()
                  if k.startswith(f"{PREFIX}completions_")}
    assert batch_puts == {f"{PREFIX}{p.name}": 1 for p in closed}
    assert not re.search(r"upload of \S+ failed", kms_run.log), kms_run.log[-3000:]

    for key, value in kms_run.s3.env().items():
        monkeypatch.setenv(key, value)
    report = verify_run(run_dir)  # through the proxy: run.toml names it
    assert report.ok, report.problems
    summary = {c.name: c.detail for c in report.checks}
    assert summary["s3_objects_match"] == (f"{len(closed)} objects with the recorded size and "
                                           "SHA-256 checksum")


async def test_the_decommission_gate_passes_behind_sse_kms_etags(
        kms_run: KmsRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in kms_run.s3.env().items():
        monkeypatch.setenv(key, value)  # the local agent's environment: the node's keys
    node = Node(name="gen-kms", run_dir=str(kms_run.run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    link = AgentLink(node)
    await link.connect()
    try:
        pulled = await pull_node(link, node, tmp_path / "pulls")
        assert pulled.ok, pulled.failed
        gate = await checklist(link, node, tmp_path / "pulls")
    finally:
        await link.close()
    assert gate.ok, gate.items
    assert [i.name for i in gate.items] == ["run finished", "verify (S3 and counts)",
                                            "nothing refused", "artifacts pulled"]


def test_bytes_changed_in_s3_fail_verify_by_checksum_naming_the_object(
        kms_run: KmsRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _copy(kms_run, tmp_path)
    s3 = kms_run.s3
    prefix = own_prefix(run_dir, s3, "kms-corrupted")
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    assert verify_run(run_dir).ok
    # Same size, other bytes, put by a writer that sends a checksum of its own bytes: S3
    # accepts it, and only the checksum against uploads.jsonl shows the change.
    name = "completions_000003.jsonl"
    data = bytearray((run_dir / "completions" / name).read_bytes())
    data[10] = ord("X") if data[10] != ord("X") else ord("Y")
    s3.client().put_object(Bucket=s3.bucket, Key=f"{prefix}{name}", Body=bytes(data),
                           ChecksumAlgorithm="SHA256",
                           ChecksumSHA256=sha256_b64(hashlib.sha256(data).hexdigest()))
    report = verify_run(run_dir)
    assert not report.ok
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert failed.keys() == {"s3_objects_match"}, failed
    recorded = {r["batch"]: r for r in _records(run_dir)}[name]
    span = ranges_text(spans(batch_indices(run_dir / "completions" / name)), 5)
    assert (f"{name} (indices {span}): s3://{s3.bucket}/{prefix}{name} has size {len(data)} "
            f"and SHA-256 {hashlib.sha256(data).hexdigest()}; uploads.jsonl says size "
            f"{len(data)}, SHA-256 {recorded['sha256']}") in failed["s3_objects_match"]


def test_lines_from_before_checksums_are_verified_by_etag_and_say_so(
        run_copy: Path, s3_env: S3Server, made_run: MadeRun) -> None:
    prefix = own_prefix(run_copy, s3_env, "before-checksums")
    records = _records(run_copy)
    client = s3_env.client()
    # Three batches as the engine recorded them before checksums: no `checksum` in the line,
    # the object put with Content-MD5 only.
    old = records[:3]
    for rec in old:
        del rec["checksum"]
        body = (run_copy / "completions" / str(rec["batch"])).read_bytes()
        client.put_object(Bucket=s3_env.bucket, Key=str(rec["key"]), Body=body,
                          ContentMD5=base64.b64encode(hashlib.md5(body).digest()).decode())
    (run_copy / "uploads.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = verify_run(run_copy)
    assert report.ok, report.problems
    detail = {c.name: c.detail for c in report.checks}
    assert detail["s3_objects_match"] == (
        f"{len(records) - 3} objects with the recorded size and SHA-256 checksum; 3 objects "
        "with the recorded size and ETag (verified by ETag: uploaded before checksums)")

    # One of them changed: named, by ETag, and said to be judged so.
    name = str(old[1]["batch"])
    client.put_object(Bucket=s3_env.bucket, Key=f"{prefix}{name}", Body=b'{"index": 1}\n')
    report = verify_run(run_copy)
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert failed.keys() == {"s3_objects_match"}, failed
    assert f"s3://{s3_env.bucket}/{prefix}{name} has size 13 and ETag" in \
        failed["s3_objects_match"]
    assert "(verified by ETag: uploaded before checksums)" in failed["s3_objects_match"]


def test_how_a_head_confirms_an_upload() -> None:
    """The rule the upload thread applies to its HEAD: the SHA-256 when S3 keeps one (the
    ETag then never matters), ETag = MD5 only where it keeps none."""
    body = b'{"index": 1}\n'
    sha, md5 = hashlib.sha256(body).hexdigest(), hashlib.md5(body).hexdigest()
    url = "s3://b/runs/x/completions_000000.jsonl"

    def head(checksum: str | None, etag: str, size: int = len(body)) -> dict[str, object]:
        return {"ContentLength": size, "ETag": f'"{etag}"',
                **({"ChecksumSHA256": checksum} if checksum else {})}

    assert confirm(head(sha256_b64(sha), kms_etag(md5)), url, len(body), sha, md5) == "sha256"
    assert confirm(head(None, md5), url, len(body), sha, md5) is None
    other = hashlib.sha256(b"other").hexdigest()
    for bad, said in ((head(sha256_b64(other), md5), f"SHA-256 {other}, expected {sha}"),
                      (head(None, kms_etag(md5)), "no SHA-256 checksum and ETag"),
                      (head(sha256_b64(sha), md5, 3), f"size 3, expected {len(body)}")):
        with pytest.raises(RuntimeError, match=re.escape(said)) as exc:
            confirm(bad, url, len(body), sha, md5)
        assert str(exc.value).startswith(url)


def test_a_lost_disk_on_an_sse_kms_bucket_is_restored_by_checksum(
        kms_run: KmsRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """resume-from-s3's restore where no ETag is the MD5: each batch is proven by the SHA-256
    S3 keeps (by ETag alone nothing could be restored), and the records say so."""
    from agents.artifacts.restore import restore_run_dir
    from agents.rundir.spec import load_spec

    for k, v in kms_run.s3.env().items():
        monkeypatch.setenv(k, v)
    spec_path = tmp_path / "run.toml"
    spec_path.write_text((kms_run.run_dir.parent / "run.toml").read_text().replace(
        f'dir = "{kms_run.run_dir}"', f'dir = "{tmp_path / "run"}"'))
    out = restore_run_dir(load_spec(spec_path))
    records = _records(out.run_dir)
    assert out.batches == len(_records(kms_run.run_dir)) == len(records) > 1
    assert out.done == PROMPTS
    for r in records:
        md5 = hashlib.md5((out.run_dir / "completions" / str(r["batch"])).read_bytes()).hexdigest()
        assert r["checksum"] == "sha256" and r["etag"] == kms_etag(md5) != md5, r
    originals = {r["batch"]: r["sha256"] for r in _records(kms_run.run_dir)}
    assert {r["batch"]: r["sha256"] for r in records} == originals
