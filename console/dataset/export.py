"""A verified source's current lines written as Parquet shards (pyarrow), with the figures the
card needs counted on the way. Written into a temporary folder beside DIR and moved in only
when every line was read and written: a refused line leaves no half dataset behind."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.dataset.rows import RowError, row, schema
from console.dataset.source import Data
from trainer.readstats import ReadStats

SHARD_BYTES = 256 << 20  # text per shard: the Hub's viewer and loaders like a few hundred MB
ROW_GROUP = 1000
MARK = ".fleetdeck-dataset.json"  # says DIR holds an export of ours, which may be replaced
DATA = "data"


class ExportError(ValueError):
    """The export was refused: says why and where."""


@dataclass
class Figures:
    rows: int = 0
    finish: Counter[str] = field(default_factory=Counter)
    truncated_by_limit: Counter[int] = field(default_factory=Counter)
    answers_by_limit: Counter[int] = field(default_factory=Counter)
    lengths: list[int] = field(default_factory=list)  # completion tokens, every row
    hedged: list[int] = field(default_factory=list)
    deadline: list[int] = field(default_factory=list)
    attempts: Counter[int] = field(default_factory=Counter)
    shards: list[str] = field(default_factory=list)
    bytes: int = 0
    stats: ReadStats = field(default_factory=ReadStats)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, r: dict[str, Any], deadline: bool) -> None:
        self.rows += 1
        n = int(r["usage"]["completion_tokens"])
        self.finish[r["finish_reason"]] += 1
        self.answers_by_limit[r["max_tokens"]] += 1
        if r["finish_reason"] == "length":
            self.truncated_by_limit[r["max_tokens"]] += 1
        self.lengths.append(n)
        self.attempts[r["attempt"]] += 1
        if r["hedged"]:
            self.hedged.append(n)
        if deadline:
            self.deadline.append(n)


def _size(r: dict[str, Any]) -> int:
    return sum(len(r[k] or "") for k in ("reasoning", "content", "tool_calls", "tools")) + \
        sum(len(m["content"] or "") + len(m["extra"] or "") for m in r["messages"])


def prepare_dir(out: Path) -> Path:
    """DIR must be new, empty, or an export of ours; the temporary folder beside it."""
    if out.exists() and any(out.iterdir()) and not (out / MARK).is_file():
        raise ExportError(f"{out}: not empty and not a dataset fleetdeck wrote: give a new "
                          "or empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.fleetdeck-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / DATA).mkdir(parents=True)
    return tmp


def write_shards(data: Data, tmp: Path, shard_bytes: int = SHARD_BYTES) -> Figures:
    """Every current line as a row, in shards of about `shard_bytes` of text; ExportError on
    the first line that cannot be one (bad JSON, a field too large), naming its file:line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sch = schema()
    fig = Figures()
    writer: Any = None
    pending: list[dict[str, Any]] = []
    in_shard = 0

    def flush() -> None:
        if pending:
            writer.write_table(pa.Table.from_pylist(pending, schema=sch))
            pending.clear()

    def close() -> None:
        nonlocal writer, in_shard
        if writer is not None:
            flush()
            writer.close()
            writer, in_shard = None, 0

    try:
        for where, line in data.lines(fig.stats):
            _refuse_bad(fig.stats)
            try:
                r = row(line, where)
            except RowError as exc:
                raise ExportError(str(exc)) from None
            if writer is None:
                name = f"{DATA}/part-{len(fig.shards):05d}.parquet"
                fig.shards.append(name)
                writer = pq.ParquetWriter(tmp / name, sch, compression="zstd")
            pending.append(r)
            fig.add(r, (line.index, line.attempt) in data.deadline_retried)
            if len(fig.samples) < 3:
                fig.samples.append(r)
            size = _size(r)
            in_shard += size
            fig.bytes += size
            if len(pending) >= ROW_GROUP:
                flush()
            if in_shard >= shard_bytes:
                close()
        close()
    finally:
        if writer is not None:
            writer.close()
    _refuse_bad(fig.stats)
    if not fig.rows:
        raise ExportError(f"{data.what}: no line to export")
    # The Hub's split naming: train-00000-of-00003.parquet.
    named = []
    for k, old in enumerate(fig.shards):
        new = f"{DATA}/train-{k:05d}-of-{len(fig.shards):05d}.parquet"
        os.replace(tmp / old, tmp / new)
        named.append(new)
    fig.shards = named
    return fig


def _refuse_bad(stats: ReadStats) -> None:
    if stats.bad:
        first = stats.bad_examples[0]
        more = f" (and {stats.bad - 1} more)" if stats.bad > 1 else ""
        raise ExportError(f"{first.where}: {first.reason}{more}: a batch line that cannot be "
                          "read is never exported; fix or remove it on the node, pull again")


def finish(tmp: Path, out: Path, mark: dict[str, Any]) -> None:
    """Move the new dataset into DIR (an older export of ours there is replaced)."""
    (tmp / MARK).write_text(json.dumps(mark, indent=1) + "\n")
    if out.exists():
        old = out.with_name(f".{out.name}.fleetdeck-old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
