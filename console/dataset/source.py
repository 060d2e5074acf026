"""What a dataset is made from, verified first: a node's pulled copy, or a campaign through
its commits (its S3 prefix, or a copy of it). Both are read with the trainer's one batch-line
reader (trainer/sources.py `current_lines`, trainer/campaign.py), which takes the highest
attempt of each index and leaves superseded lines out.

A pulled copy VERIFIES when:
- its run finished (progress.json says done or stopped) and the node had no open batch with
  lines in it when it was pulled (the manifest lists the `.partial` as empty or not at all);
- every closed batch the manifest saved at pull time lists is here, with that size and
  sha256 (hashed again now), and no batch is here that the manifest does not list;
- with [s3]: every one of them was confirmed in S3 with that hash (`in_s3`, from the node's
  uploads.jsonl), so these are the bytes S3 holds; without [s3]: the manifest's hash, made
  by the node at pull time, is the record;
- the lines agree with the run's own records: every index in .done_indices has a current
  line and no current line lacks its index there, every index within the prompts file (pin).
A campaign verifies when its commits hold together, every chunk of every generation is
committed and every batch a commit names has the commit's size and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agents.engine.store import parse_done_line
from agents.rundir.batchnames import PARTIAL, is_closed_batch
from agents.rundir.schema import BatchLine, ManifestEntry
from console.artifacts.pullset import STATE_DIR
from console.dataset.journals import (
    Failure,
    NodeRun,
    failure,
    journal_events,
    read_journals,
)
from trainer.readstats import ReadStats, SourceError

PULL_ALL = "pull it again with `fleetdeck pull NODE --all` (batches held in S3 too)"


class NotVerified(ValueError):
    """The copy does not verify: refused, with every reason."""

    def __init__(self, where: str, problems: list[str]) -> None:
        self.where, self.problems = where, problems
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more"
                                           if len(problems) > 8 else "")
        super().__init__(f"{where}: does not verify, not exported: {shown}")


@dataclass
class Data:
    """A verified source, ready to read once."""

    what: str  # words for the card and messages
    kind: str  # "node" or "campaign"
    reader: Any  # .lines(stats) -> Iterator[(where, BatchLine)]
    failures: list[Failure] = field(default_factory=list)
    deadline_retried: set[tuple[int, int]] = field(default_factory=set)  # (index, attempt)
    progress: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] | None = None
    pin: dict[str, Any] = field(default_factory=dict)
    spec_text: str | None = None
    # A campaign's nodes as its prefix shows them (console/dataset/journals.py).
    nodes: list[NodeRun] = field(default_factory=list)

    def lines(self, stats: ReadStats) -> Iterator[tuple[str, BatchLine]]:
        yield from self.reader.lines(stats)


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        got = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: unreadable: {exc}") from None
    if not isinstance(got, dict):
        raise SourceError(f"{path}: not a JSON object")
    return got


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _manifest(copy: Path) -> list[ManifestEntry]:
    path = copy / STATE_DIR / "manifest.json"
    try:
        return msgspec.json.decode(path.read_bytes(), type=list[ManifestEntry])
    except FileNotFoundError:
        raise NotVerified(str(copy), [f"no {STATE_DIR}/manifest.json: not a copy `fleetdeck "
                                      "pull` made"]) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise NotVerified(str(copy), [f"{path}: unreadable manifest: {exc}"]) from None


def failures_of(path: Path) -> tuple[list[Failure], set[tuple[int, int]]]:
    """The indices whose last event in a failures journal is `failed` (by class), and every
    (index, attempt) a missed deadline sent again."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], set()
    last, deadline = journal_events(data, str(path))
    return [failure(i, e) for i, e in sorted(last.items()) if e.event == "failed"], deadline


class _CheckedFolder:
    """A node copy's batches, read with the trainer's reader; the index sets compared with
    .done_indices as they go by."""

    def __init__(self, files: list[Path], copy: Path, done: set[int] | None,
                 prompts_lines: int | None) -> None:
        self.files, self.copy, self.done, self.prompts_lines = files, copy, done, prompts_lines

    def lines(self, stats: ReadStats) -> Iterator[tuple[str, BatchLine]]:
        from trainer.sources import current_lines

        seen: set[int] = set()
        for where, line in current_lines(self.files, stats):
            if self.prompts_lines is not None and not 0 <= line.index < self.prompts_lines:
                raise NotVerified(str(self.copy), [f"{where}: index {line.index} outside the "
                                                   f"prompts file's {self.prompts_lines} lines"])
            seen.add(line.index)
            yield where, line
        if self.done is not None and seen != self.done:
            extra, missing = sorted(seen - self.done), sorted(self.done - seen)
            raise NotVerified(str(self.copy), [
                f"the batches hold {len(extra)} indices .done_indices does not "
                f"({extra[:5]}) and lack {len(missing)} it records ({missing[:5]})"])


def node_copy(copy: Path) -> Data:
    """A pulled copy (PULL_DIR/NODE/RUN), verified; NotVerified with every reason."""
    if not copy.is_dir():
        raise SourceError(f"{copy}: no pulled copy there: `fleetdeck pull NODE --all` first")
    entries = _manifest(copy)
    problems: list[str] = []
    progress = _json_file(copy / "progress.json") or {}
    status = progress.get("status")
    if status not in ("done", "stopped"):
        problems.append(f"the run was {status or 'of unknown status'} when pulled (done or "
                        "stopped only: pull it again once it ended)")
    spec_text = (copy / "run.toml").read_text() if (copy / "run.toml").is_file() else None
    with_s3 = spec_text is not None and _has_s3(spec_text)
    listed: dict[str, ManifestEntry] = {}
    for e in entries:
        name = e.path.rpartition("/")[2]
        if e.kind == "open_batch" or name.endswith(PARTIAL):
            if e.size > 0:
                problems.append(f"{e.path}: the node still had an open batch of {e.size} bytes")
        elif e.kind == "batch" and e.path.startswith("completions/") and is_closed_batch(name):
            listed[e.path] = e
    files: list[Path] = []
    for rel, e in sorted(listed.items()):
        here = copy / rel
        if not here.is_file():
            problems.append(f"{rel}: not in this copy ({PULL_ALL})")
            continue
        size = here.stat().st_size
        got = file_sha256(here)
        if (size, got) != (e.size, e.sha256):
            problems.append(f"{here}: {size} bytes, sha256 {got}, but the manifest saved at "
                            f"pull time says {e.size} bytes, sha256 {e.sha256}: changed "
                            "since it was pulled")
            continue
        if with_s3 and not e.in_s3:
            problems.append(f"{rel}: never confirmed in S3 with this hash (uploads.jsonl): "
                            "run `fleetdeck verify NODE` on the node")
        files.append(here)
    comp = copy / "completions"
    strays = sorted(p.relative_to(copy).as_posix() for p in comp.glob("*")
                    if is_closed_batch(p.name) and p.relative_to(copy).as_posix()
                    not in listed) if comp.is_dir() else []
    problems += [f"{s}: a batch the manifest does not list (not the node's)" for s in strays]
    if not listed:
        problems.append("the manifest lists no closed batch")
    if problems:
        raise NotVerified(str(copy), problems)
    pin = _json_file(copy / "run.pin.json") or {}
    lines = pin.get("prompts_lines")
    failed, deadline = failures_of(copy / "failures.jsonl")
    return Data(f"node copy {copy}", "node",
                _CheckedFolder(files, copy, _done(copy / "completions" / ".done_indices"),
                               lines if isinstance(lines, int) else None),
                failed, deadline, progress, _json_file(copy / "provenance.json"), pin,
                spec_text)


def _has_s3(spec_text: str) -> bool:
    import tomllib

    try:
        return "s3" in tomllib.loads(spec_text)
    except tomllib.TOMLDecodeError:
        return False


def _done(path: Path) -> set[int] | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    out: set[int] = set()
    for lineno, raw in enumerate(data.splitlines(), 1):
        try:
            key = parse_done_line(raw)
        except ValueError:
            raise SourceError(f"{path}:{lineno}: not an index: {raw[:80]!r}") from None
        if key is not None:
            out.add(key[0])
    return out


def campaign(where: str, cache: Path, endpoint_url: str | None = None,
             client: Any = None) -> Data:
    """A campaign through its commits: `where` is s3://BUCKET/PREFIX or a copy of the prefix."""
    from trainer import campaign as camp

    if where.startswith("s3://"):
        from trainer.sources import _client, _s3_parts

        bucket, prefix = _s3_parts(where)
        prefix = camp.normal(prefix)
        client = client or _client(bucket, endpoint_url)
        if not camp.is_campaign_prefix(client, bucket, prefix):
            raise SourceError(f"{where}: no campaign there (no {camp.PIN})")
        src = camp.from_s3(client, bucket, prefix, cache)
    else:
        from trainer.folderstore import FolderStore

        folder = Path(where)
        if not camp.is_campaign_folder(folder):
            raise SourceError(f"{where}: not a copy of a campaign's prefix (no {camp.PIN})")
        src = camp.from_folder(folder)
        client, bucket, prefix = FolderStore(folder), "", ""
    if src.uncommitted:
        raise NotVerified(where, [f"{src.uncommitted} chunk(s) not committed yet: the campaign "
                                  "has not finished (its lines would be missing)"])
    assert src.union is not None
    seen = read_journals(client, bucket, prefix, src.union, src.where)
    pin = msgspec.to_builtins(src.pin)
    return Data(src.what, "campaign", src, seen.failures, seen.deadline, {}, None, pin, None,
                seen.nodes)
