"""Completion batches as input to data preparation: a local folder or `s3://bucket/prefix`.

A campaign's prefix (or a pulled copy of one: `campaign.json` at its top) is read through
its commits (`trainer/campaign.py`). A plain run's: S3 objects are copied into a local cache
first (kept between runs, an object copied again only when its size or ETag changed),
because choosing the highest `attempt` per index needs two passes over the lines. A line
that cannot be read is recorded with its file and line number, never raised.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from agents.rundir.batchnames import is_closed_batch
from agents.rundir.schema import BatchLine, batch_line_decoder, line_key_decoder
from trainer import campaign
from trainer.readstats import BadLine, ReadStats, SourceError

# Closed batches only (the engine's names): an open `.partial` batch may end in a torn line
# and is still growing, and the run directory's other JSONL files are not completions.

# Under prepare's output folder: a plain run's copied objects, and a campaign's (apart, so
# one's files are never read as the other's).
CACHE = "source"
CAMPAIGN_CACHE = "campaign"


class Source(Protocol):
    @property
    def what(self) -> str: ...

    def lines(self, stats: ReadStats) -> Iterator[tuple[str, BatchLine]]: ...


@dataclass
class BatchFolder:
    """A plain run's batch files: for every index the line with the highest attempt."""

    files: list[Path]
    data: str

    @property
    def what(self) -> str:
        return f"{len(self.files)} batch files from {self.data}"

    def lines(self, stats: ReadStats) -> Iterator[tuple[str, BatchLine]]:
        return current_lines(self.files, stats)


def open_source(data: str, out: Path, endpoint_url: str | None = None,
                client: Any = None) -> Source:
    """`[train] data` opened, its S3 objects copied under `out`: a campaign through its
    commits, anything else as a plain run's batches."""
    if not data.startswith("s3://"):
        folder = Path(data)
        if campaign.is_campaign_folder(folder):
            return campaign.from_folder(folder)
        campaign.refuse_inside_folder(folder)
        return BatchFolder(batch_files(folder), data)
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = _s3_parts(data)
    if client is None:
        client = _client(bucket, endpoint_url)
    try:
        if campaign.is_campaign_prefix(client, bucket, prefix):
            return campaign.from_s3(client, bucket, prefix, out / CAMPAIGN_CACHE)
        campaign.refuse_inside_prefix(client, bucket, prefix)
    except (BotoCoreError, ClientError) as exc:
        raise SourceError(f"{data} at {endpoint_url or 'AWS'}: {exc}") from None
    return BatchFolder(batch_files(fetch_s3(data, out / CACHE, endpoint_url, client)), data)


def _client(bucket: str, endpoint_url: str | None) -> Any:
    from agents.engine.uploader import make_s3_client
    from agents.rundir.spec import S3Section

    return make_s3_client(S3Section(bucket=bucket, endpoint_url=endpoint_url))


def _s3_parts(url: str) -> tuple[str, str]:
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise SourceError(f"{url}: names no bucket (s3://bucket/prefix)")
    return bucket, prefix


def fetch_s3(url: str, cache: Path, endpoint_url: str | None = None,
             client: Any = None) -> Path:
    """Copy the batch objects under an S3 prefix into `cache`; return that folder."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = _s3_parts(url)
    if client is None:
        client = _client(bucket, endpoint_url)
    cache.mkdir(parents=True, exist_ok=True)
    etags = cache / ".etags.json"
    known: dict[str, str] = {}
    if etags.exists():
        try:
            known = msgspec.json.decode(etags.read_bytes(), type=dict[str, str])
        except msgspec.DecodeError:
            known = {}
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                key = obj["Key"]
                # Batches sit right under the prefix (the engine's key is prefix + name);
                # "runs/gen10/..." is not under "runs/gen1".
                name = key[len(prefix):].lstrip("/")
                if "/" in name or not is_closed_batch(name):
                    continue
                local = cache / name
                stamp = f"{obj['Size']}:{obj.get('ETag', '')}"
                if local.exists() and known.get(name) == stamp:
                    continue
                tmp = local.with_name(f".{name}.part")
                client.download_file(bucket, key, str(tmp))
                tmp.replace(local)
                known[name] = stamp
    except (BotoCoreError, ClientError) as exc:
        where = endpoint_url or "AWS"
        raise SourceError(f"{url} at {where}: {exc}") from None
    finally:
        etags.write_bytes(msgspec.json.encode(known))
    return cache


def batch_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such folder")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and is_closed_batch(p.name))
    if not files:
        raise SourceError(f"{folder}: no completion batches (completions_*.jsonl)")
    return files


def _lines(path: Path, stats: ReadStats) -> Iterator[tuple[int, bytes]]:
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if raw.strip():
                    yield lineno, raw
    except OSError as exc:
        stats.record_bad(f"{path}", f"unreadable: {exc.strerror or exc}")


def current_lines(files: list[Path], stats: ReadStats) -> Iterator[tuple[str, BatchLine]]:
    """Yield (file:line, batch line) for the highest attempt of every index.

    Pass one decodes only `index` and `attempt`; pass two decodes the winning lines fully.
    """
    best: dict[int, tuple[int, int, int]] = {}
    for fno, path in enumerate(files):
        for lineno, raw in _lines(path, stats):
            stats.lines += 1
            try:
                key = line_key_decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                stats.record_bad(f"{path}:{lineno}", f"malformed line: {exc}")
                continue
            seen = best.get(key.index)
            if seen is not None:
                stats.superseded += 1
                if key.attempt < seen[0]:
                    continue
            best[key.index] = (key.attempt, fno, lineno)
    wanted: dict[int, set[int]] = {}
    for _attempt, fno, lineno in best.values():
        wanted.setdefault(fno, set()).add(lineno)
    for fno, path in enumerate(files):
        lines = wanted.get(fno)
        if not lines:
            continue
        for lineno, raw in _lines(path, ReadStats()):
            if lineno not in lines:
                continue
            try:
                yield f"{path}:{lineno}", batch_line_decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                stats.record_bad(f"{path}:{lineno}", f"malformed batch line: {exc}")


__all__ = ["BadLine", "BatchFolder", "ReadStats", "Source", "SourceError", "batch_files",
           "current_lines", "fetch_s3", "open_source"]
