"""Nodes given back early. When `decommission-check NODE` passes, the console keeps the proof
next to the node's pulled copy: PULL_DIR/NODE/decommission-check.json (when, the run, the
node's status as it answered). A campaign node with that record that no longer answers was
given back, not lost: `status CAMPAIGN` counts its shard with the figures it had when it
passed, `rebalance --auto` ends when the others are done, and `verify CAMPAIGN` judges it by
the union in S3. A node that passed is about to leave, so no move ever sends it work. A record
stops holding (and is removed) once the node answers for another run, working again, or with
more to do than it had (launched again, resumed, given work): then it is a node like any
other."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.atomic import atomic_write
from agents.rundir.schema import Snapshot
from console.campaign import LIVE, Member
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


# A link that says the node is not there (its figures, if any, are the last it sent).
DOWN = ("unreachable", "reconnecting", "connecting")


def holds(rec: GivenBack, live: Snapshot | None) -> bool:
    """Whether what the node says now is still the run that passed, finished, with nothing
    more to do (None: it says nothing)."""
    if live is None:
        return True
    if live.run != rec.run or live.status in LIVE:
        return False
    now, then = live.progress, rec.snapshot.progress
    return now is None or then is None or now.total <= then.total


def when(rec: GivenBack) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.checked_at))


def judged(pull_dir: Path, node: str, link: str, live: Snapshot | None) -> GivenBack | None:
    """The pass that still speaks for `node`, or None. A node that answers with a snapshot
    the pass does not hold for (another run, working again, more to do) voids it: the record
    is removed, so a later outage of that node is an outage, not a node given back."""
    rec = read_record(pull_dir, node)
    if rec is None:
        return None
    if link in DOWN:
        return rec
    if link == "connected" and live is not None and not holds(rec, live):
        record_path(pull_dir, node).unlink(missing_ok=True)
        return None
    return rec


def with_given_back(fleet: Fleet, members: list[Member]) -> list[Member]:
    """`members` with what the console's records say: a node whose link is down and that
    passed decommission-check shows as given back, with its figures then; one that answers
    and passed is marked leaving (it takes no work)."""
    out = []
    for m in members:
        rec = judged(fleet.pull_dir, m.node, m.link, m.snapshot)
        if rec is None:
            out.append(m)
        elif m.link in DOWN:
            # Its figures then; its alerts then are not news (an idle-GPU one least of all).
            then = msgspec.structs.replace(rec.snapshot, alerts=[])
            out.append(Member(m.node, LINK, then,
                              f"passed decommission-check at {when(rec)}; not answering now "
                              f"({m.error or m.link})", leaving=True))
        else:
            out.append(replace(m, leaving=True))
    return out


__all__ = ["DOWN", "LINK", "RECORD", "GivenBack", "holds", "judged", "read_record",
           "record_path", "when", "with_given_back", "write_record"]
