"""`fleetdeck-train prepare`: completion batches -> token shards, a report and the gate.

Every index's highest attempt is rendered with the target's chat template, tokenised with
an offset-derived loss mask, and written to the train or held-out split (chosen by a hash
of the index, so a re-run with more data keeps the split). Samples under the minimum of
supervised tokens are counted and left out; the gate refuses a mostly unusable data set.
New shards replace the old ones only when the gate passes.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.rundir.atomic import atomic_write, fsync_dir, make_dirs
from agents.rundir.schema import BatchLine
from agents.rundir.spec import DEFAULT_MAX_LENGTH
from trainer.render import RenderError, Sample, Supervise, render, tokenize
from trainer.report import (
    REPORT_NAME,
    Histogram,
    PrepareReport,
    Problem,
    campaign_note,
    judge,
    lengths_of,
)
from trainer.shards import ShardWriter
from trainer.sources import ReadStats, open_source

log = logging.getLogger("fleetdeck.train.prepare")


class PrepareError(ValueError):
    """Input that cannot be prepared at all (tokenizer, source); the message says which."""


@dataclass(frozen=True)
class PrepareSettings:
    data: str
    tokenizer: str
    out: Path
    endpoint_url: str | None = None
    supervise: Supervise = "final"
    keep_truncated: bool = False
    max_length: int = DEFAULT_MAX_LENGTH
    # max_length was set (in [train] or on the command line): the gate lets its cut through.
    max_length_explicit: bool = False
    max_cut_share: float = 0.05
    block_size: int = 16
    max_under_min_share: float = 0.2
    heldout_share: float = 0.01
    workers: int = 1


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise PrepareError(f"tokenizer {path}: cannot load: {exc}") from None
    if not getattr(tok, "is_fast", False):
        raise PrepareError(f"tokenizer {path}: not a fast tokenizer (character offsets needed)")
    if not getattr(tok, "chat_template", None):
        raise PrepareError(f"tokenizer {path}: has no chat template")
    return tok


def is_heldout(index: int, share: float) -> bool:
    digest = hashlib.blake2b(index.to_bytes(8, "little", signed=True), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < share


# One tokenizer per worker process, loaded once by the pool's initializer.
_worker_tok: Any = None


def _init_worker(path: str) -> None:
    global _worker_tok
    _worker_tok = load_tokenizer(path)


def _process(job: tuple[str, BatchLine, Supervise, int]) -> tuple[str, Sample | str]:
    where, line, supervise, max_length = job
    try:
        return where, tokenize(_worker_tok, render(_worker_tok, line, supervise), max_length)
    except RenderError as exc:
        return where, str(exc)


def _samples(settings: PrepareSettings, jobs: Iterator[tuple[str, BatchLine, Supervise, int]],
             tok: Any) -> Iterator[tuple[str, Sample | str]]:
    if settings.workers <= 1:
        global _worker_tok
        _worker_tok = tok
        yield from map(_process, jobs)
        return
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(settings.workers, _init_worker, (settings.tokenizer,)) as pool:
        yield from pool.imap(_process, jobs, chunksize=64)


def prepare(settings: PrepareSettings) -> PrepareReport:
    out = settings.out
    make_dirs(out)
    tok = load_tokenizer(settings.tokenizer)
    source = open_source(settings.data, out, settings.endpoint_url)
    log.info("reading %s", source.what)

    stats = ReadStats()
    tmp = out / f".prepare-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    writers = {"train": ShardWriter(tmp, "train"), "heldout": ShardWriter(tmp, "heldout")}
    min_supervised = 2 * settings.block_size
    hist = Histogram(min_supervised)
    counts = {"completions": 0, "truncated": 0, "aborted": 0, "samples": 0, "tokens": 0,
              "supervised": 0, "under_min": 0, "tool_call": 0, "boundary": 0,
              "lost_answer": 0}
    lengths: list[int] = []
    flags: dict[str, tuple[int, bool, bool]] = {}

    def jobs() -> Iterator[tuple[str, BatchLine, Supervise, int]]:
        for where, line in source.lines(stats):
            counts["completions"] += 1
            truncated = line.finish_reason == "length"
            counts["truncated"] += truncated
            if line.finish_reason == "abort":
                counts["aborted"] += 1
                continue
            if truncated and not settings.keep_truncated:
                continue
            flags[where] = (line.index, truncated, bool(line.tool_calls))
            yield where, line, settings.supervise, settings.max_length

    try:
        for where, result in _samples(settings, jobs(), tok):
            index, truncated, tool_call = flags.pop(where)
            if isinstance(result, str):
                stats.record_bad(where, result)
                continue
            counts["samples"] += 1
            counts["tokens"] += len(result.input_ids)
            counts["supervised"] += result.supervised
            counts["tool_call"] += tool_call
            counts["boundary"] += result.boundary_merge
            lengths.append(result.length)
            counts["lost_answer"] += result.lost_answer
            hist.add(result.supervised)
            if result.supervised < min_supervised:
                counts["under_min"] += 1
                continue
            split = "heldout" if is_heldout(index, settings.heldout_share) else "train"
            writers[split].add(index, result, truncated, tool_call)
        for w in writers.values():
            w.close()
        report = _report(settings, stats, counts, hist, writers, min_supervised, lengths)
        _install(out, tmp, report.gate.passed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    atomic_write(out / REPORT_NAME, _encode(report))
    for p in report.problems[:10]:
        log.warning("%s: %s", p.where, p.reason)
    note = campaign_note(report)
    if note is not None:
        log.info("campaign: %s", note)
    return report


def _report(settings: PrepareSettings, stats: ReadStats, counts: dict[str, int],
            hist: Histogram, writers: dict[str, ShardWriter], min_supervised: int,
            lengths: list[int]) -> PrepareReport:
    samples = counts["samples"]
    cut = lengths_of(lengths, settings.max_length, settings.max_length_explicit,
                     counts["lost_answer"], settings.max_cut_share)
    completions = counts["completions"]
    return PrepareReport(
        source=settings.data, tokenizer=settings.tokenizer, supervise=settings.supervise,
        keep_truncated=settings.keep_truncated, max_length=settings.max_length,
        block_size=settings.block_size, lines=stats.lines, bad_lines=stats.bad,
        problems=[Problem(b.where, b.reason) for b in stats.bad_examples],
        superseded=stats.superseded, completions=completions,
        truncated=counts["truncated"],
        truncated_share=counts["truncated"] / completions if completions else 0.0,
        aborted=counts["aborted"], samples=samples, tokens=counts["tokens"],
        supervised_tokens=counts["supervised"], min_supervised=min_supervised,
        under_min=counts["under_min"],
        under_min_share=counts["under_min"] / samples if samples else 0.0,
        tool_call=counts["tool_call"],
        tool_call_share=counts["tool_call"] / samples if samples else 0.0,
        boundary_merges=counts["boundary"], histogram=hist.bins(),
        train_samples=writers["train"].rows, heldout_samples=writers["heldout"].rows,
        train_tokens=writers["train"].tokens,
        left_out=stats.left_out, unnamed_batches=stats.unnamed_batches,
        uncommitted_chunks=stats.uncommitted_chunks,
        lengths=cut,
        gate=judge(samples, counts["under_min"], min_supervised, settings.max_under_min_share,
                   cut),
    )


def _install(out: Path, tmp: Path, passed: bool) -> None:
    """Old shards go either way (they describe other data); new ones only past the gate,
    fsynced and their names too before the report (written after) says they are there."""
    for old in list(out.glob("train-*.arrow")) + list(out.glob("heldout-*.arrow")):
        old.unlink()
    if passed:
        for new in sorted(tmp.glob("*.arrow")):
            with open(new, "rb") as f:
                os.fsync(f.fileno())
            new.replace(out / new.name)
    fsync_dir(out)


def _encode(report: PrepareReport) -> bytes:
    import msgspec

    return msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n"
