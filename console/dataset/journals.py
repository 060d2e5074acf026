"""Failures journals read for a dataset (a node's, or a campaign's nodes' in S3), and a
campaign's nodes as its prefix shows them beside the commits: each committing run's
failures journal (`journals/NODE/RUN_ID/failures.jsonl`, the class of every index its commit
marks failed, and the deadlines it missed), its provenance.json, and when its commits began
and ended (the wall time, on the nodes' own clocks). Nothing here is trusted: a journal line
that is not an event is refused by name, a provenance that is not a JSON object is said."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agents.queue import s3ops
from agents.queue.layout import Layout
from agents.queue.ranges import expand
from agents.queue.union import Union
from agents.rundir.schema import FailureEvent, failure_decoder
from agents.rundir.spec import name_problem
from trainer.readstats import SourceError

JOURNAL_LIMIT = 256 << 20  # a journal read whole up to this; past it, the rest is said unread


@dataclass
class Failure:
    index: int
    error: str
    message: str
    attempt: int | None = None


def journal_events(data: bytes, where: str) -> tuple[dict[int, FailureEvent],
                                                    set[tuple[int, int]]]:
    """A failures journal's last event per index, and every (index, attempt) a missed
    deadline sent again; SourceError naming where:line for a line that is not an event."""
    last: dict[int, FailureEvent] = {}
    deadline: set[tuple[int, int]] = set()
    for lineno, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            ev = failure_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SourceError(f"{where}:{lineno}: unreadable journal line: {exc}") from None
        if ev.index is None:
            continue
        last[ev.index] = ev
        if ev.event == "requeued" and ev.what == "deadline":
            deadline.add((ev.index, ev.attempt or 1))
    return last, deadline


def failure(index: int, ev: FailureEvent) -> Failure:
    return Failure(index, ev.error or "?", (ev.message or "")[:300], ev.attempt)


@dataclass
class NodeRun:
    """One run of one node that committed chunks of the campaign."""

    node: str
    run_id: str
    commits: int = 0
    started_at: float | None = None  # its first commit's chunk start (its clock)
    committed_at: float | None = None  # its last commit
    provenance: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # From its pulled copy, when there is one (attach_pulled).
    pulled: str | None = None
    gpus: int | None = None
    gpu_hours: float | None = None
    usd: float | None = None

    @property
    def hours(self) -> float | None:
        if self.started_at is None or self.committed_at is None:
            return None
        return max(0.0, self.committed_at - self.started_at) / 3600


@dataclass
class Seen:
    nodes: list[NodeRun]
    failures: list[Failure]
    deadline: set[tuple[int, int]]


def plain_names(node: str, run_id: str, where: str) -> None:
    """A commit's node and run id become folder names here (PULL_DIR/NODE, S3's
    journals/NODE/RUN_ID): each must be one plain name, as the fleet file's node names are;
    SourceError naming the record otherwise."""
    for what, name in (("node", node), ("run_id", run_id)):
        bad = name_problem(name)
        if bad is not None:
            raise SourceError(f"{where}: {what} {name!r} {bad}: a commit record names a "
                              "folder it may not; this campaign is not exported")


def _runs(u: Union, named: Callable[[int, int], str]) -> tuple[
        dict[tuple[str, str], NodeRun], dict[int, tuple[str, str, int]]]:
    """Every committing (node, run id) with its commits' span, and, for each index whose
    final commit marks it failed, that commit's (node, run id, attempt)."""
    runs: dict[tuple[str, str], NodeRun] = {}
    failed_by: dict[int, tuple[str, str, int]] = {}
    final = u.final()
    for g in sorted(u.commits):
        for chunk, c in u.commits[g].items():
            plain_names(c.node, c.run_id, named(g, chunk))
            r = runs.setdefault((c.node, c.run_id), NodeRun(c.node, c.run_id))
            r.commits += 1
            r.started_at = c.started_at if r.started_at is None else min(r.started_at,
                                                                         c.started_at)
            r.committed_at = c.committed_at if r.committed_at is None else max(
                r.committed_at, c.committed_at)
            for i in expand(c.failed):
                if final.get(i, (None,))[0] == g:
                    failed_by[i] = (c.node, c.run_id, c.attempt)
    return runs, failed_by


def _object(client: Any, bucket: str, key: str, limit: int) -> bytes | None:
    got = s3ops.read(client, bucket, key, limit)
    return None if got is None else got[0]


def read_journals(client: Any, bucket: str, prefix: str, u: Union, where: str) -> Seen:
    """Each committing run's journal and provenance from the campaign's prefix."""
    layout = Layout(prefix)
    runs, failed_by = _runs(u, lambda g, n: f"{where}{layout.commit(g, n)[len(prefix):]}")
    # The node and run whose batch holds each index's current line (a deadline retry is
    # counted only where the line it made is the one exported).
    line_of: dict[int, tuple[str, str]] = {}
    for i, (_g, state, key) in u.final().items():
        if state == "done" and key is not None:
            parts = key.split("/")
            if len(parts) >= 4:
                line_of[i] = (parts[-3], parts[-2])
    failures: dict[int, Failure] = {}
    deadline: set[tuple[int, int]] = set()
    for (node, run_id), r in sorted(runs.items()):
        key = layout.journal(node, run_id, "failures.jsonl")
        data = _object(client, bucket, key, JOURNAL_LIMIT)
        if data is None:
            r.notes.append(f"no failures journal at {where}{key[len(prefix):]}")
        else:
            if len(data) >= JOURNAL_LIMIT:
                r.notes.append(f"failures journal read to its first {JOURNAL_LIMIT >> 20} MiB")
                data = data[: data.rfind(b"\n") + 1]
            last, missed = journal_events(data, f"{where}{key[len(prefix):]}")
            deadline |= {(i, a) for i, a in missed if line_of.get(i) == (node, run_id)}
            for i, ev in last.items():
                if ev.event == "failed" and failed_by.get(i, ("",))[:2] == (node, run_id):
                    failures[i] = failure(i, ev)
        prov_key = layout.journal(node, run_id, "provenance.json")
        raw = _object(client, bucket, prov_key, 4 << 20)
        if raw is None:
            r.notes.append("no provenance.json in S3")
            continue
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            r.notes.append(f"provenance.json unreadable: {exc}")
            continue
        if isinstance(doc, dict):
            r.provenance = doc
        else:
            r.notes.append("provenance.json is not a JSON object")
    for i, (node, run_id, attempt) in failed_by.items():
        if i not in failures:  # its commit says failed, its journal does not say why
            failures[i] = Failure(i, "unknown (not in its node's journal)",
                                  f"marked failed by the commit of {node} ({run_id})", attempt)
    return Seen(sorted(runs.values(), key=lambda r: (r.node, r.run_id)),
                [failures[i] for i in sorted(failures)], deadline)


def attach_pulled(nodes: list[NodeRun], pull_dir: Any) -> None:
    """GPU-hours and cost of each run from its pulled copy (PULL_DIR/NODE/RUN, the one whose
    queue/member.json names that run id), where there is one: S3 holds neither."""
    from pathlib import Path

    for r in nodes:
        plain_names(r.node, r.run_id, f"node run {r.node!r} ({r.run_id!r})")
        base = Path(pull_dir) / r.node
        for copy in sorted(base.iterdir()) if base.is_dir() else []:
            member, progress = _json(copy / "queue" / "member.json"), _json(
                copy / "progress.json")
            if member is None or member.get("run_id") != r.run_id or progress is None:
                continue
            gh, gpus, cost = progress.get("gpu_hours"), progress.get("gpus"), \
                progress.get("cost")
            if isinstance(gh, int | float) and not isinstance(gh, bool):
                r.gpu_hours = float(gh)
                r.gpus = gpus if isinstance(gpus, int) else None
            usd = cost.get("usd") if isinstance(cost, dict) else None
            if isinstance(usd, int | float) and not isinstance(usd, bool):
                r.usd = float(usd)
            r.pulled = str(copy)
            break


def _json(path: Any) -> dict[str, Any] | None:
    try:
        got = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None
