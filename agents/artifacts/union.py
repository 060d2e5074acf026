"""A campaign's union, judged from S3 alone: every index of the prompts file owned by exactly
one shard, done in exactly one shard's batches or failed, and every ceded range adopted.

The node reads the campaign's shared prefix with its own [s3] settings: the batches directly
under it (grouped by shard), each shard's uploaded journals (`journals/{tag}/failures.jsonl`
and `ownership.jsonl`) and the reassign records (a record counts as the dead shard ceding its
ranges to the adopter, by the record's id). An index's owner is its base shard, minus what
that shard ceded, plus what another adopted. Blocking (it reads every batch once): the RPC
method runs it in a thread."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agents.artifacts.campaign_prefix import (
    ShardJournals,
    list_batches,
    read_batches,
    read_journals,
    s3_url,
)
from agents.artifacts.verify import Check, VerifyError, run_facts
from agents.engine.ownership import OwnershipEvent, StrideRuns, expand
from agents.engine.reassigned import ReassignRecord, read_reassigns
from agents.engine.uploader import make_s3_client
from agents.rundir.schema import VerifyCheck, pin_decoder
from agents.rundir.shard import Shard, parse_shard
from agents.rundir.spec import S3Section

SHOWN = 20  # ranges named per problem; the rest are counted


class UnionShard(msgspec.Struct, omit_defaults=False):
    """One shard as S3 shows it."""

    shard: str  # "1/4"
    tag: str  # "s01of04"
    node: str | None  # when known (the caller's node list, a reassign record)
    batches: int
    lines: int
    done: int  # distinct indices in its batches
    failed: int  # owned, not done, last event "failed" in its uploaded failures.jsonl
    owned: int
    cedes: list[str]  # ids
    adopts: list[str]
    journals: bool  # both journals found in S3
    reassigned_to: str | None = None  # the node a reassign record gave its to-do to


class UnadoptedCede(msgspec.Struct, omit_defaults=False):
    """Indices a shard gave away (a cede, or a reassign record) that no shard adopted by id:
    nobody's to send until an adopt with that id takes them."""

    shard: str
    node: str | None
    id: str
    count: int
    ranges: str
    time: float
    reassign: bool  # a reassign record whose adopt has not happened yet


class UnionReport(msgspec.Struct, omit_defaults=False):
    ok: bool
    checks: list[VerifyCheck]
    problems: list[str]
    shards: list[UnionShard]
    unadopted: list[UnadoptedCede]
    reassigns: list[ReassignRecord]
    prompts_lines: int
    n: int  # the campaign's N
    s3_url: str
    batches_read: bool  # False: journals only (decommission-check), no done/missing checks
    elapsed_s: float = 0.0


# -- index sets as text -------------------------------------------------------------------------

class Runs:
    """Indices added in increasing order, kept as text-ready runs (the first SHOWN of them;
    the rest counted): `0-38 step 2, 41, 50-59`."""

    def __init__(self, limit: int = SHOWN) -> None:
        self.limit = limit
        self.count = 0
        self.shown: list[str] = []
        self.more = 0
        self._runs = StrideRuns(self._shown_run)

    def add(self, i: int) -> None:
        self.count += 1
        self._runs.add(i)

    def _shown_run(self, run: tuple[int, int, int]) -> None:
        start, stop, step = run
        last = stop - 1
        if len(self.shown) >= self.limit:
            self.more += 1
        elif start == last:
            self.shown.append(f"{start}")
        elif step == 1:
            self.shown.append(f"{start}-{last}")
        elif last - start == step:
            self.shown.append(f"{start}, {last}")
        else:
            self.shown.append(f"{start}-{last} step {step}")

    def text(self) -> str:
        self._runs.close()
        parts = list(self.shown)
        if self.more:
            parts.append(f"... ({self.more} more ranges)")
        return ", ".join(parts) if parts else "none"


def indices_text(indices: Iterable[int], limit: int = SHOWN) -> str:
    runs = Runs(limit)
    for i in sorted(set(indices)):
        runs.add(i)
    return runs.text()


# -- the union ----------------------------------------------------------------------------------

class Union:
    """Everything read once, then judged."""

    def __init__(self, client: Any, s3: S3Section, n: int, total: int,
                 nodes: list[str] | None = None) -> None:
        self.client = client
        self.s3 = s3
        self.n = n
        self.total = total
        self.shards = [Shard(k, n) for k in range(n)]
        # Node names by shard: the caller's list (K-th node, K-th shard), else what the
        # reassign records say.
        self.nodes: dict[int, str] = dict(enumerate(nodes)) if nodes and len(nodes) == n \
            else {}
        self.checks: dict[str, Check] = {}
        self.journals: list[ShardJournals] = []
        self.reassigns: list[ReassignRecord] = []
        self.reassign_ids: set[str] = set()
        self.reassigned_to: dict[int, str] = {}
        # Indices whose owner is not their base shard's alone: index -> owners (shard k).
        self.moved: dict[int, list[int]] = {}

    def check(self, name: str, summary: str) -> Check:
        c = self.checks[name] = Check(name, summary)
        return c

    def label(self, k: int) -> str:
        node = self.nodes.get(k)
        return f"{self.shards[k].text} ({node})" if node else self.shards[k].text

    # -- ownership ----------------------------------------------------------------------

    def read_ownership(self) -> None:
        c = self.check("journals", f"every shard's journals in {s3_url(self.s3)}journals/, "
                                   "readable")
        self.journals = [read_journals(self.client, self.s3, s) for s in self.shards]
        for j in self.journals:
            for p in j.problems:
                c.fail(p)
        try:
            self.reassigns = read_reassigns(self.client, self.s3)
        except Exception as exc:  # EngineError naming the record, or S3 refusing
            c.fail(str(exc))
        for rec in self.reassigns:
            try:
                dead = parse_shard(rec.shard, f"reassign record {rec.id}")
                if dead.n != self.n:
                    raise ValueError(f"reassign record {rec.id}: shard {rec.shard} is not one "
                                     f"of this campaign's {self.n}")
            except ValueError as exc:
                c.fail(str(exc))
                continue
            self.nodes.setdefault(dead.k, rec.node)
            self.reassigned_to[dead.k] = rec.to
            self.reassign_ids.add(rec.id)
            owner = self.journals[dead.k].owner
            if rec.id not in owner.cedes:  # the record is the dead shard's cede
                owner.apply(OwnershipEvent(op="cede", id=rec.id, time=rec.time,
                                           ranges=list(rec.ranges), count=rec.count))
        adopters: dict[int, list[int]] = {}
        for j in self.journals:
            for i in j.owner.adopted:
                adopters.setdefault(i, []).append(j.shard.k)
        for i in set(adopters) | {i for j in self.journals for i in j.owner.ceded}:
            base = i % self.n
            owners = [] if i in self.journals[base].owner.ceded else [base]
            self.moved[i] = owners + adopters.get(i, [])

    def owners(self, i: int) -> list[int]:
        got = self.moved.get(i)
        return [i % self.n] if got is None else got

    def owner(self, i: int) -> int | None:
        """The one shard that owns i; None when none or several do."""
        got = self.moved.get(i)
        if got is None:
            return i % self.n
        return got[0] if len(got) == 1 else None

    def unadopted(self) -> list[UnadoptedCede]:
        adopted = {id_ for j in self.journals for id_ in j.owner.adopts}
        out = []
        for j in self.journals:
            for id_, ev in j.owner.cedes.items():
                if id_ not in adopted:
                    out.append(UnadoptedCede(j.shard.text, self.nodes.get(j.shard.k), id_,
                                             ev.count, indices_text(expand(ev.ranges)),
                                             ev.time, id_ in self.reassign_ids))
        return out

    def judge_ownership(self, unadopted: list[UnadoptedCede]) -> None:
        owned = self.check("owned_once", f"every index of 0..{self.total - 1} owned by "
                                         "exactly one shard")
        waiting: set[int] = set()
        for u in unadopted:
            j = self.journals[parse_shard(u.shard, "cede").k]
            waiting.update(expand(j.owner.cedes[u.id].ranges))
        nobody, beyond = Runs(), Runs()
        several: dict[tuple[int, ...], Runs] = {}
        for i in sorted(self.moved):
            owners = self.moved[i]
            if i >= self.total:
                beyond.add(i)
            elif not owners:
                if i not in waiting:
                    nobody.add(i)
            elif len(owners) > 1:
                several.setdefault(tuple(sorted(owners)), Runs()).add(i)
        if nobody.count:
            owned.fail(f"{nobody.count} indices owned by no shard (ceded, never adopted, by "
                       f"no cede still waiting): {nobody.text()}")
        for ks, runs in several.items():
            owned.fail(f"{runs.count} indices owned by {' and '.join(self.label(k) for k in ks)}"
                       f": {runs.text()}")
        if beyond.count:
            owned.fail(f"{beyond.count} adopted indices past the prompts file's {self.total} "
                       f"lines: {beyond.text()}")
        adopted = self.check("adopted", "every ceded range adopted by a shard (by its id)")
        for u in unadopted:
            what = "reassign record" if u.reassign else "cede"
            adopted.fail(f"shard {self.label(parse_shard(u.shard, 'cede').k)}: {what} {u.id}: "
                         f"{u.count} indices nobody adopted: {u.ranges}")

    # -- batches --------------------------------------------------------------------------

    def read_done(self) -> Done:
        """Read every batch of the campaign under the prefix: which shard's batches hold each
        index (the first to), judged as they are read."""
        batches_c = self.check("batches", "every batch under the prefix is one of this "
                                          "campaign's shards', every line readable and within "
                                          "the prompts file")
        once = self.check("done_once", "no index in two shards' batches, none twice at one "
                                       "attempt in its shard's")
        by_owner = self.check("done_by_owner", "every index done by the shard that owns it")
        objects, odd = list_batches(self.client, self.s3)
        for name in odd:
            batches_c.fail(f"{name}: named like a batch, but its shard tag is not one")
        code = "B" if self.n < 255 else "H" if self.n < 65535 else "L"
        done_by = array(code, bytes(self.total * array(code).itemsize))  # 0, or shard k + 1
        out = Done(bytearray(self.total), self.n)
        twice: dict[int, set[int]] = {}
        again: dict[tuple[int, str], list[int]] = {}  # (shard, batch) -> same (index, attempt)
        first = bytearray(self.total)  # attempt 1 seen; later attempts in `later`
        later: set[tuple[int, int]] = set()
        not_owner: dict[tuple[int, int], list[int]] = {}  # (shard, owner or -1) -> indices
        mine = []
        for obj in objects:
            s = obj.name.shard
            if s is None or s.n != self.n or obj.name.open:
                why = ("an unsharded run's batch, no shard's" if s is None else
                       "an open batch's name" if obj.name.open else
                       f"shard {s.text}, not one of this campaign's {self.n}")
                batches_c.fail(f"{s3_url(self.s3, obj.key)}: {why}")
                continue
            mine.append(obj)
        for got in read_batches(self.client, self.s3, mine):
            assert got.obj.name.shard is not None
            k = got.obj.name.shard.k
            name = got.obj.key[len(self.s3.prefix):]
            out.batches[k] += 1
            if got.error is not None:
                batches_c.fail(f"{s3_url(self.s3, got.obj.key)}: cannot be read: {got.error}")
                continue
            if got.bad_lines:
                batches_c.fail(f"{name}: lines {indices_text(got.bad_lines)} do not parse "
                               "(an index and an attempt)")
            outside: list[int] = []
            out.lines[k] += len(got.indices)
            for i, a in zip(got.indices, got.attempts, strict=True):
                if i >= self.total:
                    outside.append(i)
                    continue
                have = done_by[i]
                if not have:
                    done_by[i] = k + 1
                    out.flag[i] = 1
                    out.done[k] += 1
                elif have != k + 1:
                    ks = twice.setdefault(i, {have - 1})
                    if k not in ks:
                        ks.add(k)
                        out.done[k] += 1
                elif (first[i] if a == 1 else (i, a) in later):
                    again.setdefault((k, name), []).append(i)
                if a == 1:
                    first[i] = 1
                else:
                    later.add((i, a))
                owner = self.owner(i)
                if owner != k:
                    not_owner.setdefault((k, -1 if owner is None else owner), []).append(i)
            if outside:
                batches_c.fail(f"{name}: indices past the prompts file's {self.total} lines: "
                               f"{indices_text(outside)}")
        by_shards: dict[tuple[int, ...], list[int]] = {}
        for i, ks in twice.items():
            by_shards.setdefault(tuple(sorted(ks)), []).append(i)
        for kt, idx in sorted(by_shards.items()):
            once.fail(f"{len(idx)} indices done twice, in the batches of shards "
                      f"{' and '.join(self.label(k) for k in kt)}: {indices_text(idx)}")
        for (k, name), idx in sorted(again.items()):
            once.fail(f"{name}: {len(idx)} indices already have a line of the same attempt "
                      f"in shard {self.label(k)}'s batches: {indices_text(idx)}")
        for (k, owner), idx in sorted(not_owner.items()):
            whose = (f"owned by shard {self.label(owner)}" if owner >= 0 else
                     "owned by no single shard")
            by_owner.fail(f"{len(set(idx))} indices in shard {self.label(k)}'s batches are "
                          f"{whose}: {indices_text(idx)}")
        return out

    def judge_complete(self, got: Done) -> None:
        """Every index done or failed; the rest are missing, named by their owner."""
        complete = self.check("complete", f"every index of 0..{self.total - 1} done once or "
                                          "failed")
        missing: dict[int, Runs] = {}
        data = bytes(got.flag)
        pos = 0
        while pos < self.total:
            start = data.find(b"\x00", pos)
            if start < 0:
                break
            end = data.find(b"\x01", start)
            end = self.total if end < 0 else end
            for i in range(start, end):
                owners = self.owners(i)
                if not owners:
                    continue  # nobody's: named under owned_once or adopted
                owner = owners[0] if len(owners) == 1 else -1
                if owner >= 0 and i in self.journals[owner].failed:
                    got.failed[owner] += 1
                    continue
                missing.setdefault(owner, Runs()).add(i)
            pos = end
        for owner, runs in sorted(missing.items()):
            whose = f"shard {self.label(owner)}" if owner >= 0 else "no single shard"
            complete.fail(f"{runs.count} indices of {whose} neither done nor failed "
                          f"(missing): {runs.text()}")

    # -- the report -----------------------------------------------------------------------

    def report(self, batches: bool, started: float) -> UnionReport:
        self.read_ownership()
        unadopted = self.unadopted()
        self.judge_ownership(unadopted)
        got = Done(bytearray(), self.n)
        if batches:
            got = self.read_done()
            self.judge_complete(got)
        shards = []
        for j in self.journals:
            k = j.shard.k
            shards.append(UnionShard(
                shard=j.shard.text, tag=j.shard.tag, node=self.nodes.get(k),
                batches=got.batches[k], lines=got.lines[k], done=got.done[k],
                failed=got.failed[k], owned=j.owner.count(self.total),
                cedes=list(j.owner.cedes), adopts=list(j.owner.adopts), journals=j.present,
                reassigned_to=self.reassigned_to.get(k)))
        order = ["batches", "journals", "owned_once", "done_once", "done_by_owner", "complete",
                 "adopted"]
        checks = [self.checks[name].result() for name in order if name in self.checks]
        problems = [p for name in order if name in self.checks
                    for p in self.checks[name].problems]
        return UnionReport(ok=all(c.ok for c in checks), checks=checks, problems=problems,
                           shards=shards, unadopted=unadopted, reassigns=self.reassigns,
                           prompts_lines=self.total, n=self.n, s3_url=s3_url(self.s3),
                           batches_read=batches,
                           elapsed_s=round(time.monotonic() - started, 3))


@dataclass
class Done:
    """What the batches hold: a flag per index (done by some shard), and per shard its batch
    count, lines, distinct indices and (filled by the judge) failed indices."""

    flag: bytearray
    n: int
    batches: list[int] = field(init=False)
    lines: list[int] = field(init=False)
    done: list[int] = field(init=False)
    failed: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.batches = [0] * self.n
        self.lines = [0] * self.n
        self.done = [0] * self.n
        self.failed = [0] * self.n


def union_report(run_dir: Path, shards: int | None = None, prompts_lines: int | None = None,
                 nodes: list[str] | None = None, batches: bool = True) -> UnionReport:
    """The union of the campaign this run dir is a shard of, from its [s3] prefix. N and the
    prompts file's lines default to this node's pin; VerifyError when they cannot be known or
    S3 cannot be read at all."""
    from botocore.exceptions import BotoCoreError, ClientError

    started = time.monotonic()
    _, s3 = run_facts(run_dir)
    if s3 is None:
        raise VerifyError(f"{run_dir}: no [s3] in run.toml: a campaign's union is judged from "
                          "its shared S3 prefix")
    pin = None
    try:
        pin = pin_decoder.decode((run_dir / "run.pin.json").read_bytes())
    except FileNotFoundError:
        pass
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise VerifyError(f"{run_dir / 'run.pin.json'}: unreadable: {exc}") from None
    if shards is None:
        if pin is None or pin.shard is None:
            raise VerifyError(f"{run_dir}: not a shard of a campaign (no shard in "
                              "run.pin.json): say how many shards (shards = N)")
        shards = parse_shard(pin.shard, f"{run_dir / 'run.pin.json'}").n
    if prompts_lines is None:
        if pin is None:
            raise VerifyError(f"{run_dir}: never launched (no run.pin.json): say how many "
                              "lines the prompts file has (prompts_lines)")
        prompts_lines = pin.prompts_lines
    try:
        union = Union(make_s3_client(s3), s3, shards, prompts_lines, nodes)
        return union.report(batches, started)
    except (BotoCoreError, ClientError) as exc:
        raise VerifyError(f"{s3_url(s3)}: cannot read the campaign's prefix: {exc}") from None


__all__ = ["Done", "Runs", "UnadoptedCede", "Union", "UnionReport", "UnionShard",
           "indices_text", "union_report"]
