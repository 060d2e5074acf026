"""Nodes given back early. When `decommission-check NODE` passes, the console keeps the proof
next to the node's pulled copy: PULL_DIR/NODE/decommission-check.json (when, the run, the
node's status as it answered). A campaign node with that record that no longer answers was
given back, not lost: `status CAMPAIGN` counts its shard with the figures it had when it
passed, `rebalance --auto` ends when the others are done, and `verify CAMPAIGN` judges it by
the union in S3. A node that passed is about to leave, so no move ever sends it work. A record
stops holding once the node answers for another run, or with more to do than it had (it was
launched again, or adopted work): then it is a node like any other."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.atomic import atomic_write
from agents.rundir.schema import Snapshot
from console.campaign import Member
from console.fleet import Fleet

RECORD = "decommission-check.json"
LINK = "given back"


class GivenBack(msgspec.Struct):
    node: str
    run: str
    checked_at: float
    snapshot: Snapshot


_decoder = msgspec.json.Decoder(GivenBack)


def record_path(pull_dir: Path, node: str) -> Path:
    return pull_dir / node / RECORD


def write_record(pull_dir: Path, node: str, snap: dict[str, Any]) -> Path:
    """The proof that `node` passed, with its status then (validated as a Snapshot first: a
    node's answer is kept only in the shape the console reads back)."""
    snapshot = msgspec.convert(snap, Snapshot)
    rec = GivenBack(node, snapshot.run, time.time(), snapshot)
    path = record_path(pull_dir, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, msgspec.json.encode(rec) + b"\n")
    return path


def read_record(pull_dir: Path, node: str) -> GivenBack | None:
    """The record of `node`, or None (none, or one that does not parse: never guessed)."""
    try:
        rec = _decoder.decode(record_path(pull_dir, node).read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return rec if rec.node == node else None


def holds(rec: GivenBack, live: Snapshot | None) -> bool:
    """Whether what the node says now is still the run that passed, with nothing more to do."""
    if live is None:
        return True
    if live.run != rec.run:
        return False
    now, then = live.progress, rec.snapshot.progress
    return now is None or then is None or now.total <= then.total


def when(rec: GivenBack) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.checked_at))


def with_given_back(fleet: Fleet, members: list[Member]) -> list[Member]:
    """`members` with what the console's records say: a node that does not answer and passed
    decommission-check shows as given back, with its figures then; one that answers and
    passed is marked leaving (it takes no work)."""
    out = []
    for m in members:
        rec = read_record(fleet.pull_dir, m.node)
        if rec is None or not holds(rec, m.snapshot):
            out.append(m)
        elif m.snapshot is None:
            # Its figures then; its alerts then are not news (an idle-GPU one least of all).
            then = msgspec.structs.replace(rec.snapshot, alerts=[])
            out.append(Member(m.node, LINK, then,
                              f"passed decommission-check at {when(rec)}; not answering now "
                              f"({m.error or m.link})", leaving=True))
        else:
            out.append(replace(m, leaving=True))
    return out


__all__ = ["LINK", "RECORD", "GivenBack", "holds", "read_record", "record_path", "when",
           "with_given_back", "write_record"]
