"""Reassigning a dead node's shard, judged from S3 alone: its not-done indices are those it owns
per its last uploaded ownership journal, less those done in its batches in S3, less those its
uploaded failures.jsonl says failed. The reassign record is written to S3 before anything is
adopted, under an id that a retry gives again (`reassign-<shard tag>`): a console or agent that
crashes after writing it finds it and finishes with the same ranges. Blocking."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from agents.artifacts.campaign_prefix import list_batches, read_batches, read_journals, s3_url
from agents.artifacts.verify import VerifyError, run_facts
from agents.engine.ownership import to_ranges
from agents.engine.reassigned import ReassignRecord, read_reassigns, reassign_id, reassign_key
from agents.engine.uploader import make_s3_client
from agents.rundir.schema import pin_decoder
from agents.rundir.shard import parse_shard


class ReassignRefused(ValueError):
    """Nothing was written: the reason names the shard, the node and what to do."""


def plan_reassign(run_dir: Path, id_: str, shard: str, node: str, to: str
                  ) -> tuple[ReassignRecord, bool, str]:
    """The reassign record of `shard` (dead `node`) to this run (`to`), written to S3 first;
    True when it was already there (a retry: the same record, its ranges unchanged); and the
    record's s3:// URL."""
    from botocore.exceptions import BotoCoreError, ClientError

    dead = parse_shard(shard, "reassign: shard")
    _, s3 = run_facts(run_dir)
    if s3 is None:
        raise ReassignRefused(f"{run_dir}: no [s3] in run.toml: a reassign is judged from the "
                              "campaign's S3 prefix")
    try:
        pin = pin_decoder.decode((run_dir / "run.pin.json").read_bytes())
    except FileNotFoundError:
        raise ReassignRefused(f"{run_dir}: never launched (no run.pin.json): launch this "
                              "node's shard first, then reassign to it") from None
    mine = parse_shard(pin.shard, f"{run_dir / 'run.pin.json'}") if pin.shard else None
    if mine is None or mine.n != dead.n:
        raise ReassignRefused(f"{run_dir}: this run is shard {pin.shard or 'none'}, not one of "
                              f"the {dead.n} shards of {dead.text}'s campaign")
    if mine == dead:
        raise ReassignRefused(f"{run_dir}: this node runs shard {dead.text} itself: reassign "
                              "its shard to another node of the campaign")
    total = pin.prompts_lines
    try:
        client = make_s3_client(s3)
        for rec in read_reassigns(client, s3):
            if rec.shard != dead.text:
                continue
            if rec.to != to:
                raise ReassignRefused(
                    f"shard {dead.text} was already reassigned from {rec.node} to {rec.to} "
                    f"({s3_url(s3, reassign_key(s3, rec.id))}): finish it on {rec.to}")
            return rec, True, s3_url(s3, reassign_key(s3, rec.id))
        journals = read_journals(client, s3, dead)
        if journals.problems and journals.present:
            raise ReassignRefused(f"shard {dead.text}'s journals in S3 cannot be read: "
                                  f"{'; '.join(journals.problems[:3])}; never guessed")
        objects, _ = list_batches(client, s3)
        done: set[int] = set()
        for got in read_batches(client, s3, [o for o in objects if o.name.shard == dead
                                             and not o.name.open]):
            if got.error is not None or got.bad_lines:
                raise ReassignRefused(
                    f"{s3_url(s3, got.obj.key)}: "
                    f"{got.error or f'lines {got.bad_lines[:5]} do not parse'}: which indices "
                    f"shard {dead.text} finished cannot be known; nothing reassigned")
            done.update(got.indices)
        todo = [i for i in journals.owner.owned_descending(total)
                if i not in done and i not in journals.failed]
        if not todo:
            raise ReassignRefused(f"shard {dead.text} ({node}) has nothing left to do in S3: "
                                  "every index it owns is done or failed; nothing reassigned "
                                  "(decommission-check the node instead)")
        todo.reverse()
        rec = ReassignRecord(id=id_, shard=dead.text, node=node, to=to, time=time.time(),
                             count=len(todo), ranges=to_ranges(todo))
        client.put_object(Bucket=s3.bucket, Key=reassign_key(s3, id_),
                          Body=msgspec.json.encode(rec), ContentType="application/json")
        return rec, False, s3_url(s3, reassign_key(s3, id_))
    except (BotoCoreError, ClientError) as exc:
        raise VerifyError(f"{s3_url(s3)}: cannot read or write the campaign's prefix: "
                          f"{exc}") from None


__all__ = ["ReassignRefused", "plan_reassign", "reassign_id"]
