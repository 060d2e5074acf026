"""`verify`, run on the node (which holds the S3 credentials): is what the run made whole?

S3 against uploads.jsonl (every closed batch recorded, its object present with the recorded
size and the SHA-256 checksum S3 keeps for it (HEAD), or, for a record made without one
(before checksums), the recorded ETag; the local bytes hashing to them; multipart ETags
computed with the object's part size; nothing extra or missing under the prefix) and the
counts against each other
(distinct indices in .done_indices = progress.json `completed` = current batch lines; closed
batch files = objects under the prefix). Every discrepancy names its batch and index range.
Blocking (it reads every batch once): the RPC method runs it in a thread.

A live run (its engine's pid alive, progress.json saying it runs) is judged on what is
committed: each file is read after the ones the engine writes before it (.done_indices before
the batches, uploads.jsonl before the S3 listing), what may have moved meanwhile is read again
after, and the normal gaps of a running engine (lines written but not yet recorded in the open
batch, closed batches not yet uploaded, an upload not yet recorded, progress.json a moment old)
are counted as in flight, not reported as problems. The same gaps in a run whose engine is
gone are problems, named as what they are.
"""

from __future__ import annotations

import json
import math
import os
import time
import tomllib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agents.engine.store import parse_done_line
from agents.engine.uploader import head_sha256, make_s3_client
from agents.rundir.batchnames import PARTIAL, batch_files
from agents.rundir.batchscan import BatchScan, KeySet, ranges_text, scan_batch, spans
from agents.rundir.schema import (
    UploadRecord,
    VerifyCheck,
    VerifyCounts,
    VerifyReport,
    upload_decoder,
)
from agents.rundir.spec import S3Section, SpecError, load_run_spec

MiB = 1 << 20
# When S3 will not tell an object's part size: the sizes common tools use.
PART_SIZE_GUESSES = tuple(n * MiB for n in (8, 5, 16, 15, 32, 64, 100, 128, 256, 512, 1024))
MAX_NAMED = 50  # problems named per check; the rest are counted
HEADS_AT_ONCE = 8  # a checksum is only in a HEAD: one per object, these many in flight
LIVE = ("starting", "running", "paused", "draining")


def engine_alive(progress: dict[str, Any]) -> tuple[bool, str]:
    """Whether the run's engine is running now (progress.json says it runs, and its pid is a
    live process), and a sentence saying so."""
    status = progress.get("status")
    if status not in LIVE:
        return False, ""
    pid = progress.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False, f"progress.json says {status} but names no engine pid"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, (f"progress.json says {status}, but its engine (pid {pid}) is gone: it "
                       "was stopped without a clean exit; resume the run")
    except PermissionError:
        pass  # alive, another user's
    return True, f"the run is {status} (engine pid {pid})"


def split_runs(runs: list[tuple[int, int]], within: list[tuple[int, int]]
               ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Runs of indices cut into the parts inside `within` (sorted runs) and those outside."""
    inside: list[tuple[int, int]] = []
    outside: list[tuple[int, int]] = []
    for a, b in runs:
        pos = a
        for x, y in within:
            if y < pos or x > b:
                continue
            if x > pos:
                outside.append((pos, x - 1))
            inside.append((max(pos, x), min(b, y)))
            pos = min(b, y) + 1
            if pos > b:
                break
        if pos <= b:
            outside.append((pos, b))
    return inside, outside


def _count(runs: list[tuple[int, int]]) -> int:
    return sum(b - a + 1 for a, b in runs)


class VerifyError(ValueError):
    """The directory cannot be verified at all (not a run directory, unreadable [s3])."""


def run_facts(run_dir: Path) -> tuple[str, S3Section | None]:
    """The run's kind and [s3]. A spec that no longer loads whole (its prompts file moved
    away at the end of the run, say) still gives them."""
    try:
        spec = load_run_spec(run_dir)
        return spec.run.kind, spec.s3
    except SpecError as exc:
        path = run_dir / "run.toml"
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            raise VerifyError(f"{run_dir}: not a run directory ({exc})") from None
        kind = str(raw.get("run", {}).get("kind", "generate"))
        if "s3" not in raw:
            return kind, None
        try:
            return kind, msgspec.convert(raw["s3"], S3Section)
        except msgspec.ValidationError as bad:
            raise VerifyError(f"{path}: [s3]: {bad}") from None


def multipart_count(etag: str) -> int | None:
    """3 for `<md5-of-md5s>-3`; None for a plain MD5."""
    head, sep, tail = etag.rpartition("-")
    return int(tail) if sep and head and tail.isascii() and tail.isdigit() else None


@dataclass(slots=True)
class S3Object:
    size: int
    etag: str
    sha256: str | None = None  # hex, from a HEAD with ChecksumMode=ENABLED; None: none kept


@dataclass
class Check:
    """One check being made: its problems, named, and a summary for when there are none."""

    name: str
    summary: str = ""
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.problems.append(problem)

    def result(self, note: str = "") -> VerifyCheck:
        if not self.problems:
            return VerifyCheck(self.name, True, self.summary)
        shown = self.problems[:MAX_NAMED]
        more = len(self.problems) - len(shown)
        detail = "; ".join(shown) + (f"; and {more} more" if more else "")
        return VerifyCheck(self.name, False, detail + note)


class Verifier:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.comp = run_dir / "completions"
        self.kind, self.spec = run_facts(run_dir)
        # A campaign node shares its S3 prefix with every other node: its own batches are
        # under `batches/NODE/RUN_ID/` (agents/queue/layout.py).
        self.list_prefix = self.own_prefix()
        self.progress: dict[str, Any] = {}
        self.done = KeySet()
        self.lines = KeySet()
        self.records: dict[str, UploadRecord] = {}
        self.objects: dict[str, S3Object] = {}  # under the prefix (checksums: HEADed)
        self.elsewhere: dict[tuple[str, str], S3Object | None] = {}  # records not under it
        self.part_sizes: dict[str, list[int]] = {}  # batch -> part sizes to compute
        self.s3_error: str | None = None
        self.scans: dict[str, BatchScan] = {}
        self.open_scan: BatchScan | None = None
        self.done_records = 0
        self.live = False
        self.live_note = ""
        # Read again after the batches and the listing (live runs only): what was committed
        # while verify read.
        self.done_after: KeySet | None = None
        self.records_after: dict[str, UploadRecord] = {}
        # In flight (live runs): lines written but not recorded, batches awaiting upload,
        # objects put but not yet recorded.
        self.lines_in_flight = 0
        self.uploads_pending: list[str] = []
        self.objects_in_flight: list[str] = []

    # -- reading -----------------------------------------------------------------------------

    def read_progress(self) -> None:
        try:
            self.progress = json.loads((self.run_dir / "progress.json").read_bytes())
        except (OSError, ValueError):
            self.progress = {}

    def read_done(self, check: Check, into: KeySet | None = None) -> None:
        """Read before the batches: the engine writes a line before its index, so a live run
        never shows an index without its line for that reason. `into` another set: the
        second read of a live run (problems were named by the first)."""
        keys = self.done if into is None else into
        dups: list[int] = []
        try:
            data = (self.comp / ".done_indices").read_bytes()
        except FileNotFoundError:
            data = b""
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]  # a write in progress, or a torn tail
        for lineno, raw in enumerate(data.splitlines(), 1):
            try:
                key = parse_done_line(raw)
                if key is None:
                    continue
                index = key[0]
                new = keys.add(*key)
            except ValueError:
                if into is None:
                    check.fail(f".done_indices:{lineno}: not an index: {raw[:80]!r}")
                continue
            if into is not None:
                continue
            self.done_records += 1
            if not new:
                dups.append(index)
        if dups:
            check.fail(f".done_indices records these indices twice: "
                       f"{ranges_text(_runs(dups))}")

    def read_uploads(self, check: Check, into: dict[str, UploadRecord] | None = None) -> None:
        records = self.records if into is None else into
        path = self.run_dir / "uploads.jsonl"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        if self.live and data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]  # a record being written
        for lineno, raw in enumerate(data.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                rec = upload_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                if into is None:
                    check.fail(f"uploads.jsonl:{lineno}: unreadable record: {exc}")
                continue
            records[rec.batch] = rec

    def read_again(self) -> None:
        """A live run: .done_indices and uploads.jsonl once more, after the batches and the
        listing, for what was committed while verify read them."""
        if self.lines.minus(self.done):
            self.done_after = KeySet()
            self.read_done(Check("again"), self.done_after)
        self.read_uploads(Check("again"), self.records_after)

    def list_s3(self) -> None:
        """Objects under the prefix, records outside it by HEAD, and the part size of each
        multipart ETag in the records."""
        from botocore.exceptions import BotoCoreError, ClientError

        assert self.spec is not None
        spec = self.spec
        try:
            client = make_s3_client(spec)
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=spec.bucket, Prefix=self.list_prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(self.list_prefix):]
                    if name.startswith("journals/"):
                        continue  # the run's pin and failures.jsonl: not batches, not extra
                    self.objects[obj["Key"]] = S3Object(obj["Size"], obj["ETag"].strip('"'))
            headed: list[str] = []
            for rec in self.records.values():
                if rec.bucket != spec.bucket or not rec.key.startswith(spec.prefix):
                    self.elsewhere[(rec.bucket, rec.key)] = _head(client, rec.bucket, rec.key)
                elif rec.checksum is not None and rec.key in self.objects:
                    headed.append(rec.key)
                n = multipart_count(rec.etag)
                if rec.checksum is None and n is not None:
                    self.part_sizes[rec.batch] = _part_sizes(client, rec, n)
            # A listing gives no checksum values: a HEAD of each object recorded with one.
            with ThreadPoolExecutor(HEADS_AT_ONCE) as pool:
                heads = list(pool.map(lambda key: _head(client, spec.bucket, key), headed))
            for key, obj in zip(headed, heads, strict=True):
                if obj is None:
                    del self.objects[key]  # deleted since the listing: missing
                else:
                    self.objects[key] = obj
        except (BotoCoreError, ClientError) as exc:
            self.s3_error = f"s3://{spec.bucket}/{spec.prefix}: {exc}"

    def scan(self, check: Check) -> None:
        for path in batch_files(self.comp):
            is_open = path.name.endswith(PARTIAL)
            try:
                scan = scan_batch(path, self.lines, self.part_sizes.get(path.name, []),
                                  open_batch=is_open)
            except FileNotFoundError:
                if not is_open:
                    check.fail(f"{path.name}: vanished while verify ran")
                    continue
                # The engine closed it (renamed it) between the listing and the open.
                path, is_open = path.with_name(path.name[: -len(PARTIAL)]), False
                try:
                    scan = scan_batch(path, self.lines, self.part_sizes.get(path.name, []))
                except OSError as exc:
                    check.fail(f"{path.name}: cannot read: {exc}")
                    continue
            except OSError as exc:
                check.fail(f"{path.name}: cannot read: {exc}")
                continue
            if is_open:
                self.open_scan = scan
            else:
                self.scans[path.name] = scan
            if scan.bad_lines:
                check.fail(f"{path.name}: unreadable lines {ranges_text(_runs(scan.bad_lines))}")
            if scan.duplicates:
                twice = ranges_text(_runs(i for i, _ in scan.duplicates))
                check.fail(f"{path.name}: indices {twice} already have a line of the same "
                           "attempt in an earlier batch")

    # -- comparing ---------------------------------------------------------------------------

    def where(self, name: str) -> str:
        scan = self.scans.get(name)
        return f"{name} (indices {scan.indices_text})" if scan else name

    def compare_uploads(self, recorded: Check, local: Check) -> None:
        for name, scan in self.scans.items():
            rec = self.records.get(name) or self.records_after.get(name)
            if rec is None:
                if self.live:
                    self.uploads_pending.append(name)  # the engine uploads it next
                else:
                    recorded.fail(f"{self.where(name)}: closed but not in uploads.jsonl (an "
                                  "upload pending; the engine uploads it when it runs again)")
                continue
            if scan.size != rec.size or scan.sha256 != rec.sha256:
                local.fail(f"{self.where(name)}: the local file ({scan.size} bytes, sha256 "
                           f"{scan.sha256[:12]}) differs from uploads.jsonl ({rec.size} bytes, "
                           f"sha256 {rec.sha256[:12]})")
            elif rec.checksum is None and expected_etag(scan, rec.etag) != rec.etag:
                local.fail(f"{self.where(name)}: the local bytes give ETag "
                           f"{expected_etag(scan, rec.etag)}, uploads.jsonl says {rec.etag}")
        for name in sorted(set(self.records) - set(self.scans)):
            recorded.fail(f"uploads.jsonl records {name} but RUN_DIR has no such closed batch")
        recorded.summary = f"{len(self.scans)} closed batches, each in uploads.jsonl"
        if self.uploads_pending:
            recorded.summary = (f"{len(self.scans) - len(self.uploads_pending)} closed batches "
                                f"in uploads.jsonl, {len(self.uploads_pending)} being "
                                "uploaded")
        local.summary = f"{len(self.scans)} closed batches hash as recorded"

    def compare_s3(self, objects: Check, listing: Check) -> None:
        assert self.spec is not None
        expected: set[str] = set()
        by_etag = 0
        for name, rec in sorted(self.records.items()):
            url = f"s3://{rec.bucket}/{rec.key}"
            if (rec.bucket, rec.key) in self.elsewhere:
                obj = self.elsewhere[(rec.bucket, rec.key)]
            else:
                expected.add(rec.key)
                obj = self.objects.get(rec.key)
            if rec.checksum is None:
                by_etag += 1
            if obj is None:
                objects.fail(f"{self.where(name)}: {url} is missing")
            elif rec.checksum is None:
                # Recorded without a checksum: its ETag was the MD5 then, and must be still.
                if obj.size != rec.size or obj.etag != rec.etag:
                    objects.fail(f"{self.where(name)}: {url} has size {obj.size} and ETag "
                                 f"{obj.etag}; uploads.jsonl says size {rec.size}, ETag "
                                 f"{rec.etag} (verified by ETag: uploaded before checksums)")
            elif obj.sha256 is None:
                objects.fail(f"{self.where(name)}: {url} has no SHA-256 checksum, but "
                             "uploads.jsonl says it was uploaded with one: the object was "
                             "replaced since")
            elif obj.size != rec.size or obj.sha256 != rec.sha256:
                objects.fail(f"{self.where(name)}: {url} has size {obj.size} and SHA-256 "
                             f"{obj.sha256}; uploads.jsonl says size {rec.size}, SHA-256 "
                             f"{rec.sha256}")
        later = {rec.key for rec in self.records_after.values()}
        pending = {f"{self.list_prefix}{name}" for name in self.uploads_pending}
        for key in sorted(set(self.objects) - expected):
            if self.live and (key in later or key in pending):
                self.objects_in_flight.append(key)  # put, its record being written
                continue
            listing.fail(f"s3://{self.spec.bucket}/{key}: under the prefix but not in "
                         "uploads.jsonl")
        if self.live:
            pass  # batches close and go up while verify reads: each is judged above
        elif len(self.scans) != len(self.objects):
            listing.fail(f"{len(self.scans)} closed batch files but {len(self.objects)} "
                         f"objects under s3://{self.spec.bucket}/{self.list_prefix}")
        objects.summary = objects_summary(len(self.records) - by_etag, by_etag)
        listing.summary = (f"{len(self.objects)} objects under s3://{self.spec.bucket}/"
                           f"{self.list_prefix} = {len(self.scans)} closed batch files")

    def own_prefix(self) -> str:
        """Where this run's batches are in S3: the prefix, or a campaign node's own folder."""
        if self.spec is None:
            return ""
        try:
            node = str(tomllib.loads((self.run_dir / "run.toml").read_text())["queue"]["node"])
            run_id = json.loads((self.run_dir / "queue" / "member.json").read_bytes())["run_id"]
        except (OSError, ValueError, KeyError, TypeError, tomllib.TOMLDecodeError):
            return self.spec.prefix
        from agents.queue.layout import Layout

        return Layout(self.spec.prefix).batches(node, str(run_id))

    def prompts_lines(self) -> int | None:
        try:
            pin = json.loads((self.run_dir / "run.pin.json").read_bytes())
            return int(pin["prompts_lines"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def compare_counts(self, done_vs_lines: Check, in_range: Check, counts: Check) -> None:
        for attempt, runs in self.done.minus(self.lines).items():
            tag = f" (attempt {attempt})" if attempt > 1 else ""
            done_vs_lines.fail(f".done_indices records indices {ranges_text(runs)}{tag} that "
                               "have no batch line")
        recorded = self.done_after or self.done
        open_runs = self.open_scan.runs if self.open_scan else []
        open_name = self.open_scan.name if self.open_scan else ""
        new_in_flight = 0
        for attempt, runs in self.lines.minus(recorded).items():
            tag = f" (attempt {attempt})" if attempt > 1 else ""
            tail, closed = split_runs(runs, open_runs)
            if tail and self.live:
                # Written, its record next: the gap of a group commit, not a problem.
                self.lines_in_flight += _count(tail)
                new_in_flight += _count(tail) if attempt == 1 else 0
            elif tail:
                done_vs_lines.fail(f"batch lines for indices {ranges_text(tail)}{tag} in the "
                                   f"open batch {open_name} are not recorded in .done_indices "
                                   "(the engine stopped between writing them and recording "
                                   "them; a resume records them)")
            if closed:
                done_vs_lines.fail(f"batch lines for indices {ranges_text(closed)}{tag} in "
                                   f"{', '.join(self.holding(closed)) or '?'} are not "
                                   "recorded in .done_indices")
        done_vs_lines.summary = f"{self.done_records} records = the batch lines, one for one"
        if self.lines_in_flight:
            done_vs_lines.summary = (f"{self.done_records} records = the committed batch "
                                     f"lines; {self.lines_in_flight} written, not yet recorded")
        total = self.prompts_lines()
        if total is not None:
            for what, keys in ((".done_indices", self.done), ("batch lines", self.lines)):
                beyond = keys.at_or_above(total)
                if beyond:
                    in_range.fail(f"{what} hold indices {ranges_text(beyond)} beyond the "
                                  f"prompts file ({total} lines, run.pin.json)")
        in_range.summary = f"every index within the prompts file ({total} lines)"
        done, current = self.done.distinct_indices(), self.lines.distinct_indices()
        completed = self.progress.get("completed")
        if self.live:
            # progress.json was read first and .done_indices grows after it: completed may
            # lag what is recorded, never lead it.
            committed = current - new_in_flight
            recorded_now = recorded.distinct_indices()
            counts.summary = (f"live: {committed} current lines committed, {recorded_now} "
                              f"recorded, progress.json said {completed} a moment earlier")
            if not isinstance(completed, int):
                counts.fail("progress.json has no `completed` (missing or unreadable)")
            elif completed > recorded_now:
                counts.fail(f"progress.json says completed {completed}, more than the "
                            f"{recorded_now} indices recorded in .done_indices")
            return
        counts.summary = f"{done} done = {completed} completed = {current} current lines"
        if done != current:
            counts.fail(f"{done} distinct indices in .done_indices but {current} current lines")
        if completed is None:
            counts.fail("progress.json has no `completed` (missing or unreadable)")
        elif completed != current:
            counts.fail(f"progress.json says completed {completed} but there are {current} "
                        f"current lines ({current - completed:+d})")

    def holding(self, runs: list[tuple[int, int]]) -> list[str]:
        """The batches (open one included) whose lines fall in these runs of indices."""
        scans = list(self.scans.values()) + ([self.open_scan] if self.open_scan else [])
        return [s.name for s in scans
                if any(a <= y and x <= b for a, b in runs for x, y in s.runs)][:10]

    # -- the report --------------------------------------------------------------------------

    def run(self) -> VerifyReport:
        started = time.monotonic()
        self.read_progress()
        if self.kind == "train":
            return VerifyReport(
                ok=True, checks=[VerifyCheck("kind", True, "a training run: no batches or "
                                             "uploads to verify; pull its checkpoints")],
                problems=[], counted=self.counted(), run_status=self.progress.get("status"))
        self.live, self.live_note = engine_alive(self.progress)
        lines_check = Check("batch_lines", "every batch line readable, none twice")
        done_vs_lines = Check("done_indices_match_lines")
        self.read_done(done_vs_lines)
        recorded = Check("uploads_recorded")
        self.read_uploads(recorded)
        if self.spec is not None:
            self.list_s3()
        self.scan(lines_check)
        if self.live:
            self.read_again()
        local = Check("local_batches_match_records")
        self.compare_uploads(recorded, local)
        checks = [recorded, local]
        if self.spec is None:
            checks = [Check("s3", "no [s3] in run.toml: the batches are only here; pull them")]
        elif self.s3_error is not None:
            reach = Check("s3_reachable")
            reach.fail(self.s3_error)
            checks.append(reach)
        else:
            objects, listing = Check("s3_objects_match"), Check("s3_listing")
            self.compare_s3(objects, listing)
            checks += [objects, listing]
        counts, in_range = Check("counts"), Check("indices_in_range")
        self.compare_counts(done_vs_lines, in_range, counts)
        checks += [lines_check, done_vs_lines, in_range, counts]
        status = self.progress.get("status")
        if self.live:
            checks.insert(0, Check("live", f"{self.live_note}: judged on what is committed; "
                                   f"in flight: {self.in_flight_text()}; verify again once it "
                                   "is done or stopped"))
        elif self.live_note:
            checks.insert(0, Check("live", self.live_note))
        results = [c.result() for c in checks]
        problems = [p for c in checks for p in c.problems]
        return VerifyReport(
            ok=all(r.ok for r in results), checks=results, problems=problems,
            counted=self.counted(), run_status=status,
            s3_url=f"s3://{self.spec.bucket}/{self.spec.prefix}" if self.spec else None,
            elapsed_s=round(time.monotonic() - started, 3))

    def in_flight_text(self) -> str:
        parts = [f"{self.lines_in_flight} lines written, not yet recorded"]
        if self.spec is not None:
            parts.append(f"{len(self.uploads_pending)} closed batches being uploaded")
        if self.objects_in_flight:
            parts.append(f"{len(self.objects_in_flight)} uploads being recorded")
        return ", ".join(parts)

    def counted(self) -> VerifyCounts:
        known = self.spec is not None and self.s3_error is None
        open_lines = self.open_scan.lines if self.open_scan else 0
        return VerifyCounts(
            done_indices=self.done.distinct_indices(), done_records=self.done_records,
            progress_completed=self.progress.get("completed"),
            current_lines=self.lines.distinct_indices(),
            lines=sum(s.lines for s in self.scans.values()) + open_lines,
            closed_batches=len(self.scans), open_batch_lines=open_lines,
            upload_records=len(self.records),
            s3_objects=len(self.objects) if known else None,
            s3_bytes=sum(o.size for o in self.objects.values()) if known else None)


def verify_run(run_dir: Path) -> VerifyReport:
    """Verify a run directory; VerifyError when it is not one."""
    if not (run_dir / "run.toml").is_file():
        raise VerifyError(f"{run_dir}: not a run directory (no run.toml)")
    return Verifier(run_dir).run()


def objects_summary(by_checksum: int, by_etag: int) -> str:
    parts = []
    if by_checksum or not by_etag:
        parts.append(f"{by_checksum} objects with the recorded size and SHA-256 checksum")
    if by_etag:
        parts.append(f"{by_etag} {'object' if by_etag == 1 else 'objects'} with the recorded "
                     "size and ETag (verified by ETag: uploaded before checksums)")
    return "; ".join(parts)


def expected_etag(scan: BatchScan, recorded: str) -> str:
    """The ETag the local bytes give in the recorded ETag's form: an MD5, or the multipart
    one for whichever candidate part size gives the recorded number of parts."""
    n = multipart_count(recorded)
    if n is None:
        return scan.md5
    candidates = [etag for etag in scan.etags.values() if multipart_count(etag) == n]
    if recorded in candidates:
        return recorded
    return candidates[0] if candidates else f"(no part size known for {n} parts)"


def _runs(indices: Iterable[int]) -> list[tuple[int, int]]:
    return spans(sorted(set(indices)))


def _head(client: Any, bucket: str, key: str) -> S3Object | None:
    from botocore.exceptions import ClientError

    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return S3Object(int(head["ContentLength"]), str(head["ETag"]).strip('"'), head_sha256(head))


def _part_sizes(client: Any, rec: UploadRecord, parts: int) -> list[int]:
    """Part sizes to try for a multipart ETag of `parts` parts: the object's own (the length
    of its part 1, when S3 answers a HEAD for it), else the common ones that fit."""
    from botocore.exceptions import ClientError

    if parts == 1:
        return [rec.size]  # one part: any part size from the whole size up gives this ETag
    try:
        head = client.head_object(Bucket=rec.bucket, Key=rec.key, PartNumber=1)
        size = int(head["ContentLength"])
        if size > 0 and math.ceil(rec.size / size) == parts:
            return [size]
    except ClientError:
        pass  # gone, or no part numbers here: guess
    return [ps for ps in PART_SIZE_GUESSES if math.ceil(rec.size / ps) == parts]
