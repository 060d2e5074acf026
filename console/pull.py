"""`fleetdeck pull NODE`: copy a run's artifacts here, proven by sha256.

Files come from the node's manifest (served by the agent, confined to RUN_DIR) over SFTP on
the node's SSH connection (AES-GCM preferred), several at once with pipelined reads, into
PULL_DIR/<node>/<run>/ mirroring RUN_DIR. A half-copied file resumes from its byte offset;
every file is checked against the manifest; a mismatch is fetched again once, then reported.
By default the pull set leaves out completion batches that S3 holds verified (`--all` takes
them too); for a training run it takes progress, logs and the latest and best checkpoints.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import asyncssh
import msgspec

from agents.schema import ManifestEntry, ManifestPage
from console.fleet import Node

CHUNK = 4 * 1024 * 1024
PARALLEL_FILES = 4
PART_SUFFIX = ".fdpart"
STATE_DIR = ".fleetdeck"
# Preferred ciphers for bulk copies: AES-GCM runs on the CPU's AES instructions.
PULL_CIPHERS = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr",
                "chacha20-poly1305@openssh.com"]


class PullError(RuntimeError):
    pass


class Source(Protocol):
    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None: ...

    async def close(self) -> None: ...


class SftpSource:
    """Reads from RUN_DIR on the node over SFTP, with many requests in flight per file."""

    def __init__(self, sftp: asyncssh.SFTPClient, run_dir: str) -> None:
        self.sftp = sftp
        self.run_dir = run_dir

    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None:
        async with self.sftp.open(f"{self.run_dir}/{rel}", "rb", block_size=256 * 1024,
                                  max_requests=64) as f:
            pos, end = offset, offset + length
            while pos < end:
                data = await f.read(min(CHUNK, end - pos), pos)
                assert isinstance(data, bytes)  # opened in binary mode
                if not data:
                    raise PullError(f"{rel}: the file ended at {pos} bytes, the manifest "
                                    f"says {end}")
                sink(data)
                pos += len(data)

    async def close(self) -> None:
        self.sftp.exit()


class LocalSource:
    """The same, for a node on this machine (the demo, tests of the local transport)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None:
        def copy() -> None:
            with open(os.path.join(self.run_dir, rel), "rb") as f:
                f.seek(offset)
                left = length
                while left:
                    data = f.read(min(CHUNK, left))
                    if not data:
                        raise PullError(f"{rel}: shorter than the manifest says")
                    sink(data)
                    left -= len(data)

        await asyncio.to_thread(copy)

    async def close(self) -> None:
        return None


@dataclass
class Progress:
    files_total: int = 0
    files_done: int = 0
    bytes_total: int = 0
    bytes_done: int = 0
    bytes_transferred: int = 0  # what actually crossed the wire (resumes and skips excluded)
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        dt = time.monotonic() - self.started
        return self.bytes_transferred / dt if dt > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        left = self.bytes_total - self.bytes_done
        return left / self.rate if self.rate > 0 else None


@dataclass
class PullReport:
    dest: Path
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    resumed: dict[str, int] = field(default_factory=dict)
    refetched: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    bytes_transferred: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed


def safe_rel(path: str) -> str:
    """A manifest path as a local relative path: never absolute, never '..'."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise PullError(f"manifest path {path!r} leaves the run directory; refused")
    return str(rel)


async def fetch_manifest(call: Callable[..., Any]) -> list[ManifestEntry]:
    entries: list[ManifestEntry] = []
    offset: int | None = 0
    while offset is not None:
        raw = await call("manifest", {"offset": offset, "limit": 5000})
        page = msgspec.convert(raw, ManifestPage)
        entries += page.entries
        offset = page.next_offset
    return entries


def pull_set(entries: list[ManifestEntry], role: str, everything: bool,
             train: dict[str, Any] | None = None) -> list[ManifestEntry]:
    """What must be here before the node may go: by default everything but completion
    batches that S3 holds verified; for training, the latest and best checkpoints only."""
    keep_ckpt: set[str] = set()
    if train:
        for key in ("last_checkpoint", "best_checkpoint"):
            value = train.get(key)
            if isinstance(value, str) and value:
                keep_ckpt.add(value.rstrip("/").split("/")[-1])
    chosen = []
    for e in entries:
        if e.refused is not None:
            continue
        if e.kind == "batch" and e.in_s3 and not everything:
            continue
        if e.kind == "checkpoint" and not everything and role == "train":
            parts = e.path.split("/")
            if not any(p in keep_ckpt for p in parts):
                continue
        chosen.append(e)
    return chosen


def local_sha256(path: Path, size: int) -> str | None:
    try:
        if path.stat().st_size != size:
            return None
    except FileNotFoundError:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class Puller:
    def __init__(self, source: Source, dest: Path,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        self.source = source
        self.dest = dest
        self.on_progress = on_progress
        self.progress = Progress()
        self.report = PullReport(dest)

    def _tick(self, n: int) -> None:
        self.progress.bytes_done += n
        self.progress.bytes_transferred += n
        self.report.bytes_transferred += n
        if self.on_progress is not None:
            self.on_progress(self.progress)

    async def _copy(self, e: ManifestEntry, rel: str, final: Path) -> bool:
        """Copy into final.fdpart (resuming from its size), check, then rename."""
        part = final.with_name(final.name + PART_SUFFIX)
        have = part.stat().st_size if part.exists() else 0
        if have > e.size:
            part.unlink()
            have = 0
        if have:
            self.report.resumed[rel] = have
            self.progress.bytes_done += have
        h = hashlib.sha256()
        if have:
            with open(part, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
        with open(part, "ab") as out:
            def sink(data: bytes) -> None:
                out.write(data)
                h.update(data)
                self._tick(len(data))

            await self.source.read(rel, have, e.size - have, sink)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != e.sha256:
            part.unlink()
            return False
        os.replace(part, final)
        return True

    async def _one(self, e: ManifestEntry, limit: asyncio.Semaphore) -> None:
        async with limit:
            try:
                rel = safe_rel(e.path)
            except PullError as exc:
                self.report.failed[e.path] = str(exc)
                return
            final = self.dest / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            if await asyncio.to_thread(local_sha256, final, e.size) == e.sha256:
                self.report.skipped.append(rel)
                self.progress.bytes_done += e.size
            else:
                try:
                    ok = await self._copy(e, rel, final)
                    if not ok:
                        self.report.refetched.append(rel)
                        self.progress.bytes_done -= e.size
                        ok = await self._copy(e, rel, final)
                    if ok:
                        self.report.copied.append(rel)
                    else:
                        self.report.failed[rel] = "sha256 differs from the manifest twice"
                except (OSError, asyncssh.Error, PullError) as exc:
                    self.report.failed[rel] = f"{type(exc).__name__}: {exc}"
            self.progress.files_done += 1
            if self.on_progress is not None:
                self.on_progress(self.progress)

    async def run(self, entries: list[ManifestEntry]) -> PullReport:
        self.progress.files_total = len(entries)
        self.progress.bytes_total = sum(e.size for e in entries)
        limit = asyncio.Semaphore(PARALLEL_FILES)
        # Big files first, so the long transfers overlap the many small ones.
        ordered = sorted(entries, key=lambda e: -e.size)
        await asyncio.gather(*(self._one(e, limit) for e in ordered))
        return self.report


def dest_for(pull_dir: Path, node: Node, run_name: str) -> Path:
    return pull_dir / node.name / run_name


def save_manifest(dest: Path, entries: list[ManifestEntry]) -> None:
    (dest / STATE_DIR).mkdir(parents=True, exist_ok=True)
    (dest / STATE_DIR / "manifest.json").write_bytes(msgspec.json.encode(entries))


async def open_source(node: Node, conn: asyncssh.SSHClientConnection | None) -> Source:
    if node.local:
        return LocalSource(node.run_dir)
    assert conn is not None
    return SftpSource(await conn.start_sftp_client(), node.run_dir)
