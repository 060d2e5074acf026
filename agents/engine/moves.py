"""Cede and adopt on a run whose engine is not running (stopped, finished, or no supervisor):
done in the run dir under run.lock, as the engine would, then the journals go to S3. The
supervisor uses the live engine instead when it has one."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agents.engine import EngineError
from agents.engine.journal import Journal
from agents.engine.ownership import (
    Ownership,
    OwnershipEvent,
    adopt_event,
    cede_event,
    expand,
    pick_for_cede,
)
from agents.engine.reassigned import reassign_id, reassign_key
from agents.engine.store import BatchStore
from agents.engine.uploader import check_fence, make_s3_client, put_journals
from agents.rundir.crashpoint import crash_point
from agents.rundir.schema import pin_decoder
from agents.rundir.spec import RunSpec, load_run_spec


@contextmanager
def _run_locked(run_dir: Path) -> Iterator[None]:
    fd = os.open(run_dir / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EngineError(f"{run_dir}: an engine is running this run (run.lock is held): "
                              "ask its supervisor") from None
        yield
    finally:
        os.close(fd)


def _total(run_dir: Path) -> int:
    try:
        return pin_decoder.decode((run_dir / "run.pin.json").read_bytes()).prompts_lines
    except FileNotFoundError:
        raise EngineError(f"{run_dir}: never launched (no run.pin.json): launch it first, "
                          "then move indices to or from it") from None


def _upload(spec: RunSpec, run_dir: Path) -> str | None:
    """The journals to S3 now; the reason when that failed (the next engine uploads them), or
    when the shard was reassigned (fenced, as the engine's uploads are: they stay on disk)."""
    shard = spec.shard
    if spec.s3 is None or shard is None:
        return None
    try:
        client = make_s3_client(spec.s3, timeout_s=10)
        check_fence(client, spec.s3.bucket, reassign_key(spec.s3, reassign_id(shard.tag)))
        put_journals(client, spec.s3, shard.tag,
                     [run_dir / "failures.jsonl", run_dir / "ownership.jsonl"])
    except Exception as exc:  # S3 down, or fenced: journaled on disk all the same
        return f"{type(exc).__name__}: {exc}"
    return None


@contextmanager
def _owned(run_dir: Path) -> Iterator[tuple[RunSpec, Ownership]]:
    """The run's spec and its ownership journal, open for writing, under run.lock."""
    spec = load_run_spec(run_dir)
    with _run_locked(run_dir):
        owner = Ownership.load(run_dir, spec.shard, write=True)
        try:
            yield spec, owner
        finally:
            owner.close()


def cede_offline(run_dir: Path, id_: str, count: int) -> tuple[OwnershipEvent, str | None]:
    with _owned(run_dir) as (spec, owner):
        have = owner.cedes.get(id_)
        if have is not None:
            return have, None
        total = _total(run_dir)
        store = BatchStore(run_dir, 1 << 30, total, spec.shard)
        store.recover()
        store.close()
        journal = Journal(run_dir / "failures.jsonl")
        journal.recover()
        journal.close()
        failed = {i for i, (ev, _, _) in journal.state.last.items() if ev == "failed"}
        picked = pick_for_cede(owner, total, count, store.done, (), failed)
        if not picked:
            raise EngineError(f"{run_dir}: nothing to cede: every index this run owns "
                              "is done or failed")
        ev = cede_event(id_, picked)
        owner.record(ev)
        crash_point("ceded")  # tests: killed with the cede journaled, not yet answered
    return ev, _upload(spec, run_dir)


def adopt_offline(run_dir: Path, id_: str, ranges: list[tuple[int, int, int]],
                  node: str | None, shard: str | None) -> tuple[OwnershipEvent, str | None]:
    with _owned(run_dir) as (spec, owner):
        have = owner.adopts.get(id_)
        if have is not None:
            return have, None
        total = _total(run_dir)
        indices = list(expand(ranges))
        beyond = next((i for i in indices if i >= total), None)
        if beyond is not None:
            raise EngineError(f"adopt {id_}: index {beyond} is past the prompts file's "
                              f"{total} lines: not a range of this campaign")
        ev = adopt_event(id_, [i for i in indices if not owner.owns(i)], node, shard)
        owner.record(ev)
        crash_point("adopted")  # tests: killed with the adopt journaled, nothing sent yet
    return ev, _upload(spec, run_dir)


__all__ = ["adopt_offline", "cede_offline"]
