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

from agents.rundir.atomic import fsync_dir, fsync_file
from console.dataset.rows import RowError, row, schema
from console.dataset.source import Data, file_sha256
from trainer.readstats import ReadStats

SHARD_BYTES = 256 << 20  # text per shard: the Hub's viewer and loaders like a few hundred MB
ROW_GROUP = 1000
MARK = ".fleetdeck-dataset.json"  # says DIR holds an export of ours, which may be replaced
DATA = "data"
# Left in DIR by others and never part of the export: the Hub's resumable upload keeps its
# state under .cache/huggingface/ in the folder it uploads.
NOT_OURS = (".cache",)


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


def prepare_dir(out: Path, force: bool = False) -> Path:
    """DIR must be new, empty, or an export of ours holding nothing of the user's (an edited
    card, a file added) unless `force`; the temporary folder beside it."""
    if out.exists() and any(out.iterdir()) and not (out / MARK).is_file():
        raise ExportError(f"{out}: not empty and not a dataset fleetdeck wrote: give a new "
                          "or empty folder")
    own = users_own(out)
    if own and not force:
        more = f" (and {len(own) - 10} more)" if len(own) > 10 else ""
        raise ExportError(f"{out}: holds what a new export would replace: "
                          f"{', '.join(own[:10])}{more} (edited or added since the export): "
                          "move them away, or give --force to export afresh without them")
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



CARD = "README.md"  # written by the export, then the user's to edit (license, description)


def _files(folder: Path) -> dict[str, Path]:
    """Every file under `folder` (its mark and others' state left out), by its path inside
    it; a symlink or anything not a plain file is listed as found, to refuse."""
    out: dict[str, Path] = {}
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if rel == MARK or rel.split("/")[0] in NOT_OURS or (path.is_dir()
                                                               and not path.is_symlink()):
            continue
        out[rel] = path
    return out


def _print(path: Path) -> list[Any]:
    return [path.stat().st_size, file_sha256(path)]


def fingerprint(folder: Path) -> dict[str, list[Any]]:
    """rel -> [size, sha256] of every data file of the export (shards, failures, provenance;
    not the card, which is the user's to edit): the mark keeps it, so a later run can tell
    the data is still the export it wrote."""
    return {rel: _print(p) for rel, p in sorted(_files(folder).items()) if rel != CARD}


def _mark(out: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        mark = json.loads((out / MARK).read_bytes())
    except FileNotFoundError:
        return None, f"{out}: no earlier export there"
    except (OSError, ValueError) as exc:
        return None, f"{out / MARK}: unreadable: {exc}"
    if not isinstance(mark, dict) or not isinstance(mark.get("files"), dict):
        return None, f"{out / MARK}: lists no file hashes (an export from before they were kept)"
    return mark, ""


def _data_and_card(mark: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The mark's data files and the card as written (a mark from before the card was kept
    apart lists it among its files)."""
    files: dict[str, Any] = dict(mark["files"])
    card = mark.get("card", files.pop(CARD, None))
    files.pop(CARD, None)
    return files, card


def users_own(out: Path) -> list[str]:
    """What in DIR is the user's, not the export's: the card edited since it was written,
    and every file the export did not write (a LICENSE added). A DIR with a mark this run
    cannot read: every file but the mark, since none can be told apart."""
    if not (out / MARK).is_file():
        return []
    here = _files(out)
    mark, _why = _mark(out)
    if mark is None:
        return sorted(here)
    files, card = _data_and_card(mark)
    own = []
    for rel, path in sorted(here.items()):
        if rel == CARD:
            if path.is_symlink() or not path.is_file() or _print(path) != card:
                own.append(rel)
        elif rel not in files:
            own.append(rel)
    return own


def earlier_export(out: Path, target: str, source: str) -> tuple[dict[str, Any] | None, str]:
    """DIR's mark when DIR still holds, byte for byte, the data this command wrote of the
    same target from the same source (every data file its mark lists, with that size and
    sha256); else None and why not. The card and files the user added are not compared:
    they are the user's, pushed as they are."""
    mark, why = _mark(out)
    if mark is None:
        return None, why
    if (mark.get("target"), mark.get("source")) != (target, source):
        return None, (f"{out}: an export of {mark.get('target')!r} from {mark.get('source')!r}, "
                      f"not of {target!r} from {source!r}")
    listed, _card = _data_and_card(mark)
    here = _files(out)
    for rel in sorted(here):
        if here[rel].is_symlink() or not here[rel].is_file():
            return None, f"{out / rel}: not a plain file"
    for rel, want in sorted(listed.items()):
        path = here.get(rel)
        if path is None:
            return None, f"{out / rel}: missing"
        if not (isinstance(want, list) and len(want) == 2):
            return None, f"{out / MARK}: {rel}: not [size, sha256]"
        size = path.stat().st_size
        if size != want[0] or file_sha256(path) != want[1]:
            return None, f"{out / rel}: changed since it was exported"
    return mark, f"{out}: the export of {target} made at {mark.get('made_at')}, every data " \
        "file as written"


def _fsync_tree(folder: Path) -> None:
    """Every file under `folder`, then every folder (deepest first), fsynced: the rename
    that follows must not reach the disk before the bytes it names."""
    folders = [folder]
    for path in folder.rglob("*"):
        if path.is_symlink():
            continue
        if path.is_dir():
            folders.append(path)
        elif path.is_file():
            fsync_file(path)
    for d in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def finish(tmp: Path, out: Path, mark: dict[str, Any]) -> None:
    """Move the new dataset into DIR (an older export of ours there is replaced), durably:
    its files and folders fsynced before the rename, DIR's parent after."""
    mark = {**mark, "files": fingerprint(tmp), "card": _print(tmp / CARD)}
    (tmp / MARK).write_text(json.dumps(mark, indent=1) + "\n")
    _fsync_tree(tmp)
    if out.exists():
        old = out.with_name(f".{out.name}.fleetdeck-old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(tmp, out)
        fsync_dir(out.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
        fsync_dir(out.parent)
