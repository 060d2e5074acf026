"""`fleetdeck pull NODE`: copy a run's artifacts here, proven by sha256.

Files come from the node's manifest (served by the agent, confined to RUN_DIR) into
PULL_DIR/<node>/<run>/ mirroring RUN_DIR, several at once, from one of the data paths in
console/artifacts/sources.py. Either way a half-copied file resumes from its `.fdpart` size,
every file is checked against the manifest's sha256, and a mismatch is fetched again once,
then reported. A file counted as copied is durable: its data fsynced, then renamed into place
and its folder fsynced (the folders pull makes too), so a power loss after a pull leaves what
it reported. `Puller` copies file by file through `Source.read`; `OpensshPuller` hands whole
batches of files to OpenSSH's sftp processes and checks each as sftp passes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import asyncssh

from agents.rundir.atomic import make_dirs, replace_durably
from agents.rundir.schema import ManifestEntry
from console.artifacts import opensftp
from console.artifacts.landing import EARLY_MIN, Hashed, Lander, Landing, finish_part
from console.artifacts.pullset import STATE_DIR, Confiner, safe_rel
from console.artifacts.sources import CHUNK, OpensshSource, PullError, Source
from console.artifacts.streamed import StreamFetcher
from console.fleet import PULL_STALL_S
from console.sanitize import shown

PARALLEL_FILES = 4
Fetcher = opensftp.SftpFetcher | StreamFetcher
PART_SUFFIX = ".fdpart"
# How often the OpenSSH path looks at the parts' sizes: sftp in batch mode reports no progress;
# each look also hashes what arrived in the parts of files of at least EARLY_MIN bytes.
PROGRESS_POLL_S = 0.25
# Preferred ciphers for bulk copies: AES-GCM runs on the CPU's AES instructions.
PULL_CIPHERS = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr",
                "chacha20-poly1305@openssh.com"]
T = TypeVar("T")


class Stalled(PullError):
    """Nothing came from the node for the pull's stall limit: what waited on it was stopped."""


async def watched(aw: Awaitable[T], beat: Callable[[], object], stall_s: float) -> T:
    """`aw`'s result, unless `beat()` (what has arrived so far) stays the same for `stall_s`
    seconds while it runs: then `aw` is cancelled and Stalled raised. SSH keepalives catch a
    dead connection; this catches a live one over which a node (a hung or hostile agent, a
    stuck disk there) sends nothing, which would hold a pull forever."""
    task = asyncio.ensure_future(aw)
    loop = asyncio.get_running_loop()
    last, since = beat(), loop.time()
    try:
        while True:
            await asyncio.wait({task}, timeout=min(1.0, stall_s / 4))
            if task.done():
                return task.result()
            now = beat()
            if now != last:
                last, since = now, loop.time()
            elif loop.time() - since >= stall_s:
                raise Stalled(f"the node sent nothing for {stall_s:g} s: stopped (what arrived "
                              f"stays in its {PART_SUFFIX} for the next pull to resume)")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclass
class PullProgress:
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
    data_path: str = ""  # "openssh", "asyncssh" or "local"
    notes: list[str] = field(default_factory=list)  # e.g. why OpenSSH's sftp was not used

    @property
    def ok(self) -> bool:
        return not self.failed


def local_sha256(path: Path, size: int) -> str | None:
    """The sha256 of the local copy, or None when it is not here whole (absent, another
    size, not a readable file)."""
    try:
        if path.stat().st_size != size:
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def local_path(dest: Path, path: str, confine: Confiner | None = None,
               made: set[Path] | None = None) -> tuple[str, Path]:
    """Where a manifest path goes under dest, its folder made: PullError when the path is
    refused, lands outside dest once resolved, or its folder cannot be made. Many paths:
    one `confine` for them all, and `made`, the folders made so far."""
    confine = confine or Confiner(dest)
    rel = safe_rel(path)
    final = confine(rel)
    if made is None or final.parent not in made:
        try:
            make_dirs(final.parent)
        except OSError as exc:
            raise PullError(f"{shown(rel)}: cannot make its folder: {exc}") from None
        if made is not None:
            made.add(final.parent)
    return rel, confine(rel)  # again, now that the folders are there


def _look_here(dest: Path, entries: list[ManifestEntry]
               ) -> list[tuple[str, Path, str | None, int] | PullError]:
    """For each entry: where it goes (its folder made), the sha256 of a whole copy already
    there, and the size of its part (an empty file's part made: nothing to fetch, and the
    manifest's sha256 is that of no bytes); or why it is refused. In a thread."""
    out: list[tuple[str, Path, str | None, int] | PullError] = []
    confine, made = Confiner(dest), set[Path]()
    for e in entries:
        try:
            rel, final = local_path(dest, e.path, confine, made)
        except PullError as exc:
            out.append(exc)
            continue
        here = local_sha256(final, e.size)
        part = final.with_name(final.name + PART_SUFFIX)
        if here != e.sha256 and e.size == 0:
            part.touch()
        out.append((rel, final, here, _size(part)))
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@dataclass(eq=False)
class _Part:
    """One file on the OpenSSH path: its entry, where it goes, how much of it is here."""

    entry: ManifestEntry
    rel: str
    final: Path
    part: Path
    seen: int  # the part's size when last looked at
    second: bool = False  # this is the fetch after a mismatch
    early: Hashed | None = None  # hashed while it arrives (files of EARLY_MIN bytes or more)
    hashing: asyncio.Lock = field(default_factory=asyncio.Lock)


class Puller:
    def __init__(self, source: Source, dest: Path,
                 on_progress: Callable[[PullProgress], None] | None = None,
                 stall_s: float = PULL_STALL_S) -> None:
        self.source = source
        self.dest = dest
        self.on_progress = on_progress
        self.stall_s = stall_s
        self.progress = PullProgress()
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
        got = [0]
        with open(part, "ab") as out:
            def sink(data: bytes) -> None:
                out.write(data)
                h.update(data)
                got[0] += len(data)
                self._tick(len(data))

            await watched(self.source.read(rel, have, e.size - have, sink), lambda: got[0],
                          self.stall_s)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != e.sha256:
            part.unlink()
            return False
        replace_durably(part, final)
        return True

    async def _one(self, e: ManifestEntry, limit: asyncio.Semaphore) -> None:
        async with limit:
            try:
                rel, final = local_path(self.dest, e.path)
            except PullError as exc:
                self.report.failed[e.path] = str(exc)
                self.progress.files_done += 1
                return
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
        self.report.data_path = self.source.data_path
        limit = asyncio.Semaphore(PARALLEL_FILES)
        # Big files first, so the long transfers overlap the many small ones.
        ordered = sorted(entries, key=lambda e: -e.size)
        await self._pull(ordered, limit)
        return self.report

    async def _pull(self, entries: list[ManifestEntry], limit: asyncio.Semaphore) -> None:
        await asyncio.gather(*(self._one(e, limit) for e in entries))


class OpensshPuller(Puller):
    """The OpenSSH paths: the agent's streams over ssh, or sftp processes, write the parts; here
    they are watched and checked. Files the fetcher cannot be given (a newline in a name, for
    sftp) go through `Puller`'s file-by-file copy."""

    def __init__(self, source: OpensshSource, dest: Path,
                 on_progress: Callable[[PullProgress], None] | None = None,
                 stall_s: float = PULL_STALL_S) -> None:
        super().__init__(source, dest, on_progress, stall_s)
        self.openssh = source
        self._parts: dict[str, _Part] = {}  # the files of the current round
        self._fetcher: Fetcher = source.fetcher  # the one running now
        self._lander = Lander()  # parts checked and made durable in groups

    async def _pull(self, entries: list[ManifestEntry], limit: asyncio.Semaphore) -> None:
        await self._run_openssh(self.openssh, entries, limit)

    async def _run_openssh(self, source: OpensshSource, entries: list[ManifestEntry],
                           limit: asyncio.Semaphore) -> None:
        fetcher: Fetcher = source.fetcher
        if not fetcher.usable():
            self.report.notes.append("RUN_DIR is too long for an sftp batch line: "
                                     "pulled over asyncssh")
            self.report.data_path = "asyncssh"
            await asyncio.gather(*(self._one(e, limit) for e in entries))
            return
        batched: list[ManifestEntry] = []
        apart: list[ManifestEntry] = []
        for e in entries:
            (batched if fetcher.can_name(e.path) else apart).append(e)
        # Names sftp cannot be given (a newline in them) take the per-file path meanwhile.
        await asyncio.gather(self._batched(source, batched, limit),
                             *(self._one(e, limit) for e in apart))

    async def _batched(self, source: OpensshSource, entries: list[ManifestEntry],
                       limit: asyncio.Semaphore) -> None:
        todo: list[_Part] = []
        ready: list[_Part] = []
        # Where each file goes and what of it is here, in PARALLEL_FILES threads (copies
        # already whole are hashed): a thread hop per file cost more than the looks
        # themselves (a pull of 1,000 small files waited 0.2-0.3 s before its first byte).
        shares = [entries[i::PARALLEL_FILES] for i in range(PARALLEL_FILES)]
        looked = await asyncio.gather(*(asyncio.to_thread(_look_here, self.dest, share)
                                        for share in shares if share))
        found_all = [looked[i % PARALLEL_FILES][i // PARALLEL_FILES]
                     for i in range(len(entries))]
        for e, found in zip(entries, found_all, strict=True):
            if isinstance(found, PullError):
                self._settled(e.path, failed=str(found))
                continue
            rel, final, here, have = found
            if here == e.sha256:
                self.report.skipped.append(rel)
                self.progress.bytes_done += e.size
                self._settled(rel)
                continue
            if have:
                self.report.resumed[rel] = min(have, e.size)
                self.progress.bytes_done += min(have, e.size)
            part = final.with_name(final.name + PART_SUFFIX)
            # A part as long as the file needs no fetch (a pull stopped before its check).
            (ready if have >= e.size else todo).append(_Part(e, rel, final, part, have))
        poller = asyncio.create_task(self._poll())
        try:
            again = await self._round(source, source.fetcher, todo, ready, limit)
            if again:
                self.report.refetched += [p.rel for p in again]
                await self._round(source, source.fetcher, again, [], limit)
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)

    async def _round(self, source: OpensshSource, fetcher: Fetcher, todo: list[_Part],
                     ready: list[_Part], limit: asyncio.Semaphore) -> list[_Part]:
        """One round of the fetcher over `todo`, each file checked as soon as the fetcher is
        past it (and the `ready` ones meanwhile); returns the files whose sha256 differed."""
        mismatched: list[_Part] = []
        self._parts = {p.rel: p for p in todo}
        self._fetcher = fetcher
        async with asyncio.TaskGroup() as checks:
            for p in ready:
                checks.create_task(self._check(p, None, limit, mismatched))

            waiting = {p.rel for p in todo}  # what the fetcher has not said it is past

            def done(job: opensftp.Job, said: str | None) -> None:
                waiting.discard(job.rel)
                p = self._parts[job.rel]
                if isinstance(fetcher, StreamFetcher):
                    p.early = fetcher.hashed.pop(job, None)
                checks.create_task(self._check(p, said, limit, mismatched))

            jobs = [opensftp.Job(p.rel, p.entry.size, opensftp.batch_line(p.rel) or b"")
                    for p in todo]
            try:
                # Progress is what the poller saw arrive in the parts, and files passed.
                result = await watched(
                    fetcher.fetch(jobs, self.dest, self.dest / STATE_DIR, done),
                    lambda: (self.progress.bytes_transferred, self.progress.files_done),
                    self.stall_s)
            except Stalled as exc:
                for rel in sorted(waiting):
                    self._settled(rel, failed=str(exc))
                return mismatched
            unreached = [self._parts[j.rel] for j in result.unreached]
            sftp = source.sftp_fetcher
            if (unreached and not result.connected and fetcher is not sftp
                    and sftp is not None and sftp.usable()):
                # The node's agent could not stream (one from before send-files): sftp.
                self.report.notes.append(f"the node's agent could not stream the files "
                                         f"({result.said}): pulled over sftp")
                self.report.data_path = sftp.data_path
                for p in unreached:
                    if not sftp.can_name(p.rel):
                        self.progress.bytes_done -= min(p.seen, p.entry.size)
                        self.report.resumed.pop(p.rel, None)  # _one counts it again
                        checks.create_task(self._one(p.entry, limit))
                mismatched += await self._round(
                    source, sftp, [p for p in unreached if sftp.can_name(p.rel)], [], limit)
                self._parts = {p.rel: p for p in todo}
            elif unreached and not result.connected:
                # No OpenSSH client got through while the agent link did (OpenSSH's config,
                # keys or known_hosts differ from asyncssh's): take the files over asyncssh.
                self.report.notes.append(f"OpenSSH could not reach the node "
                                         f"({result.said}): pulled over asyncssh")
                self.report.data_path = "asyncssh"
                for p in unreached:
                    self.progress.bytes_done -= min(p.seen, p.entry.size)
                    self.report.resumed.pop(p.rel, None)  # _one counts it again
                    checks.create_task(self._one(p.entry, limit))
            else:
                for p in unreached:
                    self._settled(p.rel, failed=f"not fetched: {result.said}")
        return mismatched

    async def _check(self, p: _Part, said: str | None, limit: asyncio.Semaphore,
                     mismatched: list[_Part]) -> None:
        self._saw(p, _size(p.part))
        e = p.entry
        if p.seen < e.size:
            # Not all here: the part stays, and the next pull resumes from it.
            self._settled(p.rel, failed=said or f"the copy stopped at {p.seen} of {e.size} bytes")
            return
        left = e.size - (p.early.upto if p.early is not None else 0)
        try:
            async with p.hashing:
                if left < EARLY_MIN:  # little left to hash: lands with the others due now
                    ok = await self._lander.land(Landing(p.part, p.final, e.size, e.sha256,
                                                         p.early))
                else:
                    async with limit:
                        ok = await asyncio.to_thread(finish_part, p.part, p.final, e.size,
                                                     e.sha256, p.early)
        except OSError as exc:
            self._settled(p.rel, failed=f"{type(exc).__name__}: {exc}")
            return
        if ok:
            self.report.copied.append(p.rel)
            self._settled(p.rel)
        elif not p.second:
            p.second = True
            p.seen = 0
            p.early = None
            self.progress.bytes_done -= e.size
            mismatched.append(p)
        else:
            self._settled(p.rel, failed="sha256 differs from the manifest twice")

    def _saw(self, p: _Part, size: int) -> None:
        """Count what has arrived in a part since it was last looked at."""
        if size > p.seen:
            self.progress.bytes_done += min(size, p.entry.size) - min(p.seen, p.entry.size)
            self.progress.bytes_transferred += size - p.seen
            self.report.bytes_transferred += size - p.seen
        p.seen = size

    def _settled(self, rel: str, failed: str | None = None) -> None:
        if failed is not None:
            self.report.failed[rel] = failed
        self.progress.files_done += 1
        if self.on_progress is not None:
            self.on_progress(self.progress)

    async def _poll(self) -> None:
        """The fetchers say nothing while they copy: look at the parts' sizes, and (sftp)
        hash what arrived in big ones meanwhile."""
        while True:
            await asyncio.sleep(PROGRESS_POLL_S)
            hashing = []
            fetcher = self._fetcher
            for job in list(fetcher.in_flight):
                p = self._parts.get(job.rel)
                if p is not None:
                    self._saw(p, _size(p.part))
                    if (not fetcher.hashes_inline and p.entry.size >= EARLY_MIN
                            and not p.hashing.locked()):
                        hashing.append(self._hash_more(p))
            if self.on_progress is not None:
                self.on_progress(self.progress)
            await asyncio.gather(*hashing)

    @staticmethod
    async def _hash_more(p: _Part) -> None:
        async with p.hashing:
            if p.early is None:
                p.early = Hashed()
            await asyncio.to_thread(p.early.more, p.part, p.entry.size)


def puller_for(source: Source, dest: Path,
               on_progress: Callable[[PullProgress], None] | None = None,
               stall_s: float = PULL_STALL_S) -> Puller:
    """The puller that fits the data path; `stall_s`: see `watched`."""
    if isinstance(source, OpensshSource):
        return OpensshPuller(source, dest, on_progress, stall_s)
    return Puller(source, dest, on_progress, stall_s)
