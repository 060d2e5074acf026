"""A campaign's data read through its commits (`agents/queue/union.py`): only the batch objects
the commits name, each checked against its commit's size and SHA-256, and of their lines only
those the union takes (each index from its highest committed generation), so a zombie node's
lines, or those of a backup that lost the commit race, never reach training data.

From S3 (the named objects copied into a cache, again only when their size or ETag changed)
or from a pulled copy of the prefix. A batch is found by its path under the campaign's
prefix (`batches/NODE/RUN_ID/NAME`), not by the prefix its commit was written under, so a
copied or moved campaign reads the same; its SHA-256 says it is the committed one.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.board import BoardError
from agents.queue.layout import Layout
from agents.queue.ranges import expand
from agents.queue.union import Union, read_union
from agents.rundir.atomic import atomic_write
from agents.rundir.batchnames import is_closed_batch
from agents.rundir.schema import BatchLine, batch_line_decoder, line_key_decoder
from trainer.folderstore import FolderStore
from trainer.readstats import ReadStats, SourceError

PIN = Layout("").pin
BATCHES = "batches"  # Layout.batches: PREFIX + "batches/NODE/RUN_ID/", a batch key's last 4 parts
VERIFY = "`fleetdeck verify CAMPAIGN` checks every batch against its commit"
# A node's run dir in a campaign (agents/queue/worker.py: member_file).
NODE_MARK = ("queue", "member.json")


def normal(prefix: str) -> str:
    """A prefix as the queue's Layout takes it: "" or ending in "/"."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


@dataclass
class Part:
    """A batch object the commits name, by its path under the campaign's prefix."""

    rel: str
    sha256: str
    size: int
    named_by: str  # the first commit naming it, for messages
    take: dict[int, int] = field(default_factory=dict)  # index -> attempt: the lines taken
    superseded: set[tuple[int, int]] = field(default_factory=set)  # named, a later gen's taken


@dataclass
class Batch:
    path: Path  # the local copy read
    part: Part
    origin: str  # where its bytes came from, for messages


def _rel(key: str, where: str) -> str:
    parts = key.split("/")
    rel = parts[-4:]
    if len(parts) < 4 or rel[0] != BATCHES or any(p in ("", ".", "..") for p in rel) \
            or not is_closed_batch(rel[-1]):
        raise SourceError(f"{where}: names batch {key!r}, which is not a batch key of a "
                          f"campaign ({BATCHES}/NODE/RUN_ID/completions_NNNNNN.jsonl)")
    return "/".join(rel)


def plan(u: Union, where: str) -> dict[str, Part]:
    """Every batch the commits name, with the lines the union takes from it."""
    final = u.final()
    parts: dict[str, Part] = {}
    for c, bp in u.parts():
        label = Layout("").commit(c.generation, c.chunk)
        rel = _rel(bp.key, f"{where}{label}")
        p = parts.get(rel)
        if p is None:
            p = parts[rel] = Part(rel, bp.sha256, bp.size, f"{label} (node {c.node})")
        elif (p.sha256, p.size) != (bp.sha256, bp.size):
            raise SourceError(f"{where}{rel}: {p.named_by} names it with {p.size} bytes, "
                              f"sha256 {p.sha256}, and {label} with {bp.size} bytes, sha256 "
                              f"{bp.sha256}; {VERIFY}")
        for i in expand(bp.indices):
            if final[i][0] == c.generation:
                p.take[i] = c.attempt
            else:
                p.superseded.add((i, c.attempt))
    return parts


def _union(client: Any, bucket: str, prefix: str, where: str) -> Union:
    try:
        u = read_union(client, bucket, prefix)
    except (FileNotFoundError, ValueError, BoardError) as exc:
        raise SourceError(f"{where}: {exc}") from None
    if u.problems:
        raise SourceError(f"{where}: the campaign's commits do not hold together "
                          f"({len(u.problems)} problems; `fleetdeck verify CAMPAIGN` lists "
                          "them): " + "; ".join(u.problems[:3]))
    return u


def _failed(u: Union) -> list[int]:
    return sorted(i for i, (_g, state, _key) in u.final().items() if state == "failed")


def _uncommitted(u: Union) -> int:
    return sum(n - len(u.commits.get(g, {})) for g, n in u.chunks.items())


def _mismatch(origin: str, size: int, sha: str | None, part: Part) -> str:
    got = f"{size} bytes" + (f", sha256 {sha}" if sha is not None else "")
    return (f"{origin}: {got}; {part.named_by} names it with {part.size} bytes, sha256 "
            f"{part.sha256}: not the batch that was committed, so none of it is read. {VERIFY}")


@dataclass
class CampaignSource:
    """A campaign's committed lines, ready to read."""

    where: str
    pin: rec.CampaignPin
    batches: list[Batch]
    unnamed: int  # batch objects no commit names: never read
    uncommitted: int  # chunks of any generation not committed yet
    copied: int = 0  # objects copied from S3 this time
    failed: list[int] = field(default_factory=list)  # indices their final commit marks failed

    @property
    def what(self) -> str:
        copied = f", {self.copied} copied now" if self.where.startswith("s3://") else ""
        return (f"campaign {self.pin.campaign!r} at {self.where}: {len(self.batches)} batch "
                f"objects its commits name{copied}, {self.unnamed} no commit names (not read), "
                f"{self.uncommitted} chunks not committed yet")

    def lines(self, stats: ReadStats) -> Iterator[tuple[str, BatchLine]]:
        """(file:line, batch line) for every index the union takes, once each."""
        stats.unnamed_batches += self.unnamed
        stats.uncommitted_chunks += self.uncommitted
        for batch in self.batches:
            yield from _read(batch, stats)


def _read(batch: Batch, stats: ReadStats) -> Iterator[tuple[str, BatchLine]]:
    path, part = batch.path, batch.part
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{batch.origin}: named by {part.named_by}, unreadable: "
                          f"{exc.strerror or exc}") from None
    sha = hashlib.sha256(data).hexdigest()
    if (len(data), sha) != (part.size, part.sha256):
        raise SourceError(_mismatch(batch.origin, len(data), sha, part))
    seen: set[int] = set()
    for lineno, raw in enumerate(io.BytesIO(data), 1):
        if not raw.strip():
            continue
        stats.lines += 1
        where = f"{path}:{lineno}"
        try:
            key = line_key_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            stats.record_bad(where, f"malformed line: {exc}")
            continue
        taken = part.take.get(key.index) == key.attempt
        if taken and key.index not in seen:
            seen.add(key.index)
            try:
                yield where, batch_line_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                stats.record_bad(where, f"malformed batch line: {exc}")
        elif taken or (key.index, key.attempt) in part.superseded:
            stats.superseded += 1
        else:
            stats.left_out += 1
    for i in sorted(set(part.take) - seen):
        stats.record_bad(str(path), f"index {i} attempt {part.take[i]}: {part.named_by} names "
                         "this batch for it, and it is not there")


# -- where a campaign is ----------------------------------------------------------------------


def is_campaign_folder(folder: Path) -> bool:
    return (folder / PIN).is_file()


def is_campaign_prefix(client: Any, bucket: str, prefix: str) -> bool:
    return s3ops.exists(client, bucket, Layout(normal(prefix)).pin)


def _inside_batches(parts: list[str]) -> int | None:
    """How many parts lead to the campaign above `batches/[NODE/[RUN_ID]]`, if that is the
    shape of the end of `parts`."""
    for k in range(len(parts) - 1, max(-1, len(parts) - 4), -1):
        if parts[k] == BATCHES:
            return k
    return None


def refuse_inside_folder(folder: Path) -> None:
    """A folder that holds part of a campaign's batches (of its pulled copy, or a campaign
    node's own run dir) holds lines no commit names: it must be read as the campaign."""
    full = folder.resolve()
    k = _inside_batches(list(full.parts))
    if k is not None:
        top = Path(*full.parts[:k])
        if is_campaign_folder(top):
            raise SourceError(f"{folder}: part of the batches of the campaign copied in {top}, "
                              "which also hold lines no commit names (a zombie node's, a "
                              f"backup's that lost): read the campaign itself, data = "
                              f'"{top}", through its commits')
    for run_dir in (full, full.parent):
        if run_dir.joinpath(*NODE_MARK).is_file():
            raise SourceError(f"{folder}: the batches of a campaign node (its run dir {run_dir} "
                              f"has {'/'.join(NODE_MARK)}), which also hold lines no commit "
                              "names: read the campaign through its commits, data = "
                              '"s3://BUCKET/PREFIX" of its [s3] section (or a pulled copy of '
                              "that prefix)")


def refuse_inside_prefix(client: Any, bucket: str, prefix: str) -> None:
    parts = normal(prefix).split("/")[:-1]
    k = _inside_batches(parts)
    if k is None:
        return
    top = normal("/".join(parts[:k]))
    if is_campaign_prefix(client, bucket, top):
        raise SourceError(f"s3://{bucket}/{prefix}: part of the batches of the campaign at "
                          f"s3://{bucket}/{top}, which also hold lines no commit names (a "
                          "zombie node's, a backup's that lost): read the campaign itself, "
                          f'data = "s3://{bucket}/{top}", through its commits')


# -- opening one ------------------------------------------------------------------------------


def _unnamed(rels: Iterator[str], parts: dict[str, Part]) -> int:
    return sum(1 for rel in rels if rel not in parts and is_closed_batch(rel.rpartition("/")[2]))


def from_folder(folder: Path) -> CampaignSource:
    """A pulled copy of a campaign's prefix (campaign.json, gens/, commits/, batches/)."""
    where = f"{folder}/"
    store = FolderStore(folder)
    u = _union(store, "", "", where)
    parts = plan(u, where)
    batches = []
    for rel in sorted(parts):
        part = parts[rel]
        if not part.take:
            continue
        local = folder.joinpath(*rel.split("/"))
        if not local.is_file():
            raise SourceError(f"{local}: named by {part.named_by}, missing from this copy of "
                              "the campaign: copy its prefix again")
        batches.append(Batch(local, part, str(local)))
    listed = store.list_objects_v2(Bucket="", Prefix=f"{BATCHES}/")["Contents"]
    return CampaignSource(where, u.pin, batches, _unnamed((o["Key"] for o in listed), parts),
                          _uncommitted(u), failed=_failed(u))


def from_s3(client: Any, bucket: str, prefix: str, cache: Path) -> CampaignSource:
    """The campaign at s3://bucket/prefix, its named batches copied into `cache` (mirroring
    the prefix), each checked against its commit as it is copied and again as it is read."""
    prefix = normal(prefix)
    where = f"s3://{bucket}/{prefix}"
    u = _union(client, bucket, prefix, where)
    parts = plan(u, where)
    listed: dict[str, tuple[int, str]] = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                             Prefix=f"{prefix}{BATCHES}/")
    for page in pages:
        for obj in page.get("Contents", []):
            listed[obj["Key"][len(prefix):]] = (int(obj["Size"]), _etag(obj))
    cache.mkdir(parents=True, exist_ok=True)
    stamps = cache / ".etags.json"
    known: dict[str, str] = {}
    if stamps.exists():
        try:
            known = msgspec.json.decode(stamps.read_bytes(), type=dict[str, str])
        except msgspec.DecodeError:
            known = {}
    batches = []
    copied = 0
    try:
        for rel in sorted(parts):
            part = parts[rel]
            if not part.take:
                continue
            origin = f"s3://{bucket}/{prefix}{rel}"
            there = listed.get(rel)
            if there is None:
                raise SourceError(f"{origin}: named by {part.named_by}, not in the bucket. "
                                  f"{VERIFY}")
            if there[0] != part.size:
                raise SourceError(_mismatch(origin, there[0], None, part))
            local = cache.joinpath(*rel.split("/"))
            if not (local.is_file() and known.get(rel) == f"{there[0]}:{there[1]}"):
                known[rel] = _copy(client, bucket, prefix + rel, local, part, origin)
                copied += 1
            batches.append(Batch(local, part, f"{origin} (copied to {local}: remove the copy "
                                              "to copy it again)"))
    finally:
        atomic_write(stamps, msgspec.json.encode(known))
    return CampaignSource(where, u.pin, batches, _unnamed(iter(listed), parts), _uncommitted(u),
                          copied, _failed(u))


def _etag(answer: dict[str, Any]) -> str:
    return str(answer.get("ETag", "")).strip('"')


def _copy(client: Any, bucket: str, key: str, local: Path, part: Part, origin: str) -> str:
    """Copy one object, refused unless its bytes are the commit's; its size:ETag stamp."""
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.part")
    try:
        got = client.get_object(Bucket=bucket, Key=key)
        digest = hashlib.sha256()
        size = 0
        with open(tmp, "wb") as f:
            while block := got["Body"].read(1 << 20):
                digest.update(block)
                size += len(block)
                f.write(block)
        sha = digest.hexdigest()
        if (size, sha) != (part.size, part.sha256):
            raise SourceError(_mismatch(origin, size, sha, part))
        tmp.replace(local)
    finally:
        tmp.unlink(missing_ok=True)
    return f"{size}:{_etag(got)}"
