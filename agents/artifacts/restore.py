"""`resume-from-s3`: a run directory rebuilt from the run's S3 prefix, for a run whose node
disk is gone. Its closed batches come back from S3 (each checked against the object's size
and the SHA-256 S3 keeps with it, or ETag = MD5 for an object put without one; its lines
read for the done-set), so recovery, verify, pull, retry truncated and the trainer find the
run as they always do; its failures.jsonl comes back from S3's copy, so failed indices stay
failed; its pin from S3's, re-pointed at this machine's prompts file once that hashes to the
pinned sha256. Everything is built in a sibling folder and renamed into place: a restore
killed half way leaves no half run directory. Blocking."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from agents.artifacts.s3prefix import BatchObject, get_text, list_batches, s3_url
from agents.engine import prompts as prompt_io
from agents.engine.journal import Journal
from agents.engine.pin import PIN_FILE, pin_key, read_s3_pin, spec_problem
from agents.engine.uploader import RUN_FOLDER, head_sha256, journal_key, make_s3_client
from agents.rundir.atomic import fsync_dir, make_dirs
from agents.rundir.batchnames import FOLDER
from agents.rundir.control import audit, initial_control
from agents.rundir.schema import RunPin, UploadRecord, encoder, failure_decoder, line_key_decoder
from agents.rundir.spec import RunSpec

CHUNK = 1 << 20
READERS = 8  # batch objects downloaded at once
# What makes a folder a run directory: `resume` is for those.
RUN_FILES = (PIN_FILE, "run.toml", FOLDER, "uploads.jsonl", "failures.jsonl")


class RestoreRefused(ValueError):
    """Nothing was written; the message says why and what to do."""


@dataclass(slots=True)
class Restored:
    run_dir: Path
    batches: int = 0
    lines: int = 0
    done: int = 0
    failed: int = 0
    next_batch: int = 0
    failures_in_s3: bool = True
    retry_failed: bool = False
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "batches": self.batches, "lines": self.lines,
                "done": self.done, "failed": self.failed, "next_batch": self.next_batch,
                "failures_in_s3": self.failures_in_s3, "retry_failed": self.retry_failed,
                "notes": self.notes}


@dataclass(slots=True)
class _Batch:
    obj: BatchObject
    size: int
    sha256: str
    etag: str
    uploaded_at: float
    keys: list[tuple[int, int]]
    checksum: Literal["sha256"] | None = None  # how the bytes were proven: S3's SHA-256


def restore_run_dir(spec: RunSpec, retry_failed: bool = False) -> Restored:
    """Build spec's run directory from its S3 prefix; RestoreRefused (nothing written) when
    it cannot be done safely."""
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = spec.s3
    if spec.generate is None:
        raise RestoreRefused(f"{spec.source}: not a generation run ([generate] missing): "
                             "resume-from-s3 rebuilds a generation run from its batches")
    if s3 is None:
        raise RestoreRefused(f"{spec.source}: no [s3]: resume-from-s3 rebuilds a run from its "
                             "S3 prefix; a run without one cannot be resumed off its disk")
    if spec.queue is not None:
        raise RestoreRefused(f"{spec.source}: [queue] node {spec.queue.node!r}: a campaign node "
                             "needs no restore: what it committed is the campaign's, and the "
                             "chunks it held are taken over once their leases expire; launch "
                             "it again on a fresh run dir and it claims work at once")
    run_dir = spec.run_dir
    _refuse_present(run_dir)
    try:
        client = make_s3_client(s3)
        pin = read_s3_pin(client, s3)
        if pin is None:
            raise RestoreRefused(
                f"{s3_url(s3, pin_key(s3))}: no pin: nothing under {s3_url(s3)} says "
                "which prompts its indices mean (a run started before pins were uploaded, or "
                "another prefix); nothing restored")
        local_pin = _check_prompts(spec, pin, s3_url(s3, pin_key(s3)))
        objects, odd = list_batches(client, s3)
        if odd:
            raise RestoreRefused(f"{s3_url(s3)} holds objects named like batches of no run "
                                 f"({', '.join(odd[:3])}): not one single-node run's prefix; "
                                 "nothing restored")
        closed = [o for o in objects if not o.name.open]
        failures = get_text(client, s3, journal_key(s3, RUN_FOLDER, "failures.jsonl"))
        staging = run_dir.parent / f".{run_dir.name}.from-s3.tmp"
        if staging.exists():
            shutil.rmtree(staging)  # a restore killed before its rename
        make_dirs(staging / FOLDER)
        got = list(_download_all(client, s3, closed, staging / FOLDER, pin.prompts_lines))
    except (BotoCoreError, ClientError) as exc:
        raise RestoreRefused(f"{s3_url(s3)}: cannot read the run's prefix: {exc}; nothing "
                             "restored") from None
    out = Restored(run_dir, retry_failed=retry_failed)
    out.failures_in_s3 = failures is not None
    _write_run(staging, got, local_pin, failures or b"", out, spec)
    _refuse_present(run_dir)  # another restore or launch got there while this one read S3
    if run_dir.exists():
        os.rmdir(run_dir)  # empty: the rename takes its place
    os.rename(staging, run_dir)
    fsync_dir(run_dir.parent)
    audit(run_dir, "resume_from_s3", {"prefix": s3_url(s3), "batches": out.batches,
                                      "retry_failed": retry_failed})
    return out


def _refuse_present(run_dir: Path) -> None:
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise RestoreRefused(f"{run_dir}: exists and is not a folder")
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if held:
        raise RestoreRefused(f"{run_dir}: holds a run ({', '.join(held)}): resume-from-s3 is "
                             "for a lost disk; `resume` continues the run that is here")
    if any(run_dir.iterdir()):
        raise RestoreRefused(f"{run_dir}: not empty: resume-from-s3 builds the run directory "
                             "itself; move what is there aside")


def _check_prompts(spec: RunSpec, pin: RunPin, where: str) -> RunPin:
    """This machine's prompts file must be the pinned one (by sha256); the pin, re-pointed at
    it, is what the run directory gets."""
    prompts = spec.prompts_path
    try:
        st = prompts.stat()
        sha, lines, size = prompt_io.scan(prompts)
    except OSError as exc:
        raise RestoreRefused(f"{prompts}: cannot read the prompts file ([generate] prompts in "
                             f"{spec.source}): {exc.strerror or exc}") from None
    if sha != pin.prompts_sha256:
        raise RestoreRefused(
            f"{prompts}: sha256 {sha} ({lines} lines), but the run was pinned with sha256 "
            f"{pin.prompts_sha256} ({pin.prompts_lines} lines, {where}): indices would point "
            "at other prompts; copy the run's own prompts file here. Nothing restored")
    problem = spec_problem(spec, pin, where)
    if problem is not None:
        raise RestoreRefused(problem)
    return msgspec.structs.replace(pin, prompts_path=str(prompts), prompts_size=size,
                                   prompts_lines=lines, prompts_mtime_ns=st.st_mtime_ns)


def _download_all(client: Any, s3: Any, objects: list[BatchObject], folder: Path,
                  total: int) -> Iterator[_Batch]:
    if not objects:
        return
    with ThreadPoolExecutor(max_workers=min(READERS, len(objects))) as pool:
        yield from pool.map(lambda o: _download(client, s3, o, folder, total), objects)


def _download(client: Any, s3: Any, obj: BatchObject, folder: Path, total: int) -> _Batch:
    """One batch object to `folder`, fsynced, its bytes checked against the object's size and
    the SHA-256 checksum S3 keeps with it (ETag = MD5 for one put without a checksum: under
    SSE-KMS the ETag is not the MD5), and its lines' keys read."""
    reply = client.get_object(Bucket=s3.bucket, Key=obj.key, ChecksumMode="ENABLED")
    etag = str(reply.get("ETag", "")).strip('"')
    sha, md5 = hashlib.sha256(), hashlib.md5()
    size = 0
    keys: list[tuple[int, int]] = []
    rest = b""
    path = folder / obj.key[len(s3.prefix):]
    body = reply["Body"]
    with open(path, "wb") as f:
        while chunk := body.read(CHUNK):
            f.write(chunk)
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            for raw in data[:cut].splitlines():
                keys.append(_key(raw, obj, len(keys) + 1, total))
            rest = data[cut:]
        f.flush()
        os.fsync(f.fileno())
    url = s3_url(s3, obj.key)
    if rest.strip():
        raise RestoreRefused(f"{url}: its last line has no newline: not a closed batch")
    if size != reply.get("ContentLength", size) or size != obj.size:
        raise RestoreRefused(f"{url}: read {size} bytes, the object has {obj.size}")
    kept = head_sha256(reply)
    if kept is not None:
        if kept != sha.hexdigest():
            raise RestoreRefused(f"{url}: the bytes read have SHA-256 {sha.hexdigest()}, the "
                                 f"object's checksum is {kept}: not what was put; nothing "
                                 "restored")
    elif "-" not in etag and etag != md5.hexdigest():
        raise RestoreRefused(f"{url}: the bytes read have MD5 {md5.hexdigest()}, the object's "
                             f"ETag is {etag} and it keeps no SHA-256: not what was put; "
                             "nothing restored")
    modified = reply.get("LastModified")
    return _Batch(obj, size, sha.hexdigest(), etag,
                  modified.timestamp() if modified is not None else 0.0, keys,
                  "sha256" if kept is not None else None)


def _key(raw: bytes, obj: BatchObject, lineno: int, total: int) -> tuple[int, int]:
    try:
        k = line_key_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RestoreRefused(f"{obj.key}:{lineno}: unreadable batch line ({exc}): which "
                             "indices are done cannot be known; nothing restored") from None
    if not 0 <= k.index < total or k.attempt < 1:
        raise RestoreRefused(f"{obj.key}:{lineno}: index {k.index} attempt {k.attempt} is "
                             f"outside the pinned prompts file's {total} lines")
    return k.index, k.attempt


def _write_run(staging: Path, got: list[_Batch], pin: RunPin, failures: bytes, out: Restored,
               spec: RunSpec) -> None:
    """The run directory's files in `staging`, each fsynced, the folders last."""
    assert spec.generate is not None and spec.s3 is not None
    done: dict[int, int] = {}
    records = []
    for b in got:
        for index, attempt in b.keys:
            if attempt > done.get(index, 0):
                done[index] = attempt
        out.lines += len(b.keys)
        records.append(UploadRecord(batch=b.obj.key[len(spec.s3.prefix):], size=b.size,
                                    sha256=b.sha256, key=b.obj.key, etag=b.etag,
                                    bucket=spec.s3.bucket, uploaded_at=b.uploaded_at,
                                    checksum=b.checksum))
    out.batches = len(got)
    out.done = len(done)
    out.next_batch = max((b.obj.name.number for b in got), default=-1) + 1
    # The done-set at each index's highest attempt: its current line.
    _write(staging / FOLDER / ".done_indices", "".join(
        f"{i}\n" if a <= 1 else f"{i} {a}\n" for i, a in sorted(done.items())).encode())
    _write(staging / "uploads.jsonl", b"".join(encoder.encode(r) + b"\n" for r in records))
    failures = failures[: failures.rfind(b"\n") + 1]  # whole lines: a torn tail was never said
    where = s3_url(spec.s3, journal_key(spec.s3, RUN_FOLDER, "failures.jsonl"))
    for lineno, raw in enumerate(failures.splitlines(), 1):
        if raw.strip():
            try:
                failure_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                raise RestoreRefused(f"{where}:{lineno}: unreadable record ({exc}); nothing "
                                     "restored") from None
    _write(staging / "failures.jsonl", failures)
    journal = Journal(staging / "failures.jsonl")
    state = journal.recover()
    journal.close()
    out.failed = sum(1 for i, (ev, _, _) in state.last.items() if ev == "failed" and i not in done)
    if not out.failures_in_s3:
        out.notes.append("no failures.jsonl in S3: indices that failed before are sent again")
    # control.json: run.toml's settings, and the retry counters the journal says were
    # applied, so a `retry failed` after this is a new request (and --retry-failed one now).
    control = initial_control(spec.generate.concurrency, spec.generate.max_tokens)
    control.retry.failed = state.retry_applied.get("failed", 0) + (1 if out.retry_failed else 0)
    control.retry.truncated = state.retry_applied.get("truncated", 0)
    _write(staging / "control.json", encoder.encode(control))
    _write(staging / PIN_FILE, encoder.encode(pin))
    fsync_dir(staging / FOLDER)
    fsync_dir(staging)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


__all__ = ["RestoreRefused", "Restored", "restore_run_dir"]
