"""The batch store's crash safety, exercised on its files directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.engine.doneset import DoneSet
from agents.engine.store import BatchStore, StoreError


def _line(i: int, attempt: int = 1) -> tuple[int, int, bytes]:
    return i, attempt, (json.dumps({"index": i, "attempt": attempt, "content": "x" * i}) +
                        "\n").encode()


def test_group_commit_closes_full_batches_and_numbers_on(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, batch_size=4, total=100)
    store.recover()
    closed = store.write_group([_line(i) for i in range(10)])
    assert [c.path.name for c in closed] == ["completions_000000.jsonl", "completions_000001.jsonl"]
    assert [c.lines for c in closed] == [4, 4]
    assert store.open_lines == 2
    last = store.close_open_batch()
    assert last is not None and last.lines == 2 and last.path.name == "completions_000002.jsonl"
    store.close()
    done = (tmp_path / "completions" / ".done_indices").read_text().split()
    assert done == [str(i) for i in range(10)]


def test_recovery_cuts_torn_line_and_records_fsynced_unrecorded(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, batch_size=10, total=100)
    store.recover()
    store.write_group([_line(i) for i in range(3)])
    store.close()
    comp = tmp_path / "completions"
    partial = comp / "completions_000000.jsonl.partial"
    # A crash after the lines reached the file but before their indices were recorded,
    # and a torn half line after them.
    with open(partial, "ab") as f:
        f.write(_line(3)[2] + _line(4)[2])
        f.write(b'{"index": 5, "attem')
    again = BatchStore(tmp_path, batch_size=10, total=100)
    rec = again.recover()
    assert rec.recorded_after_crash == 2
    assert rec.torn_bytes_cut == len(b'{"index": 5, "attem')
    assert rec.open_batch_lines == 5
    assert [i for i in range(6) if i in again.done] == [0, 1, 2, 3, 4]
    closed = again.write_group([_line(5)])
    assert closed == []
    batch = again.close_open_batch()
    assert batch is not None and batch.lines == 6
    lines = [json.loads(x)["index"] for x in batch.path.read_text().splitlines()]
    assert lines == [0, 1, 2, 3, 4, 5]


def test_recovery_closes_a_full_partial_and_continues_numbering(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, batch_size=3, total=100)
    store.recover()
    store.write_group([_line(i) for i in range(3)])  # closes batch 0
    store.write_group([_line(i) for i in range(3, 5)])
    store.close()
    comp = tmp_path / "completions"
    with open(comp / "completions_000001.jsonl.partial", "ab") as f:
        f.write(_line(5)[2])  # full now, crash before the close
    again = BatchStore(tmp_path, batch_size=3, total=100)
    rec = again.recover()
    assert [p.name for p in rec.closed_batches] == ["completions_000000.jsonl",
                                                    "completions_000001.jsonl"]
    assert rec.next_batch == 2
    again.write_group([_line(6)])
    assert (comp / "completions_000002.jsonl.partial").exists()


def test_two_open_batches_is_an_error_that_names_them(tmp_path: Path) -> None:
    comp = tmp_path / "completions"
    comp.mkdir()
    (comp / "completions_000001.jsonl.partial").write_bytes(_line(1)[2])
    (comp / "completions_000002.jsonl.partial").write_bytes(_line(2)[2])
    with pytest.raises(StoreError, match=r"completions_000001\.jsonl\.partial"):
        BatchStore(tmp_path, batch_size=3, total=10).recover()


def test_doneset_is_a_bitmap_with_attempts() -> None:
    d = DoneSet(1_000_000)
    assert d.add(999_999) and not d.add(999_999)
    d.add(5, attempt=3)
    assert len(d) == 2 and d.attempt(5) == 3 and d.attempt(999_999) == 1 and d.attempt(6) == 0
    assert d.has(5, 2) and not d.has(999_999, 2)
    with pytest.raises(IndexError):
        d.add(1_000_000)
    assert len(d._bits) == 125_000


def test_the_failure_count_is_kept_as_events_and_done_indices_come(tmp_path: Path) -> None:
    """The snapshot's failed figure is O(1): the journal keeps it as events and the done-set
    change, and it always equals the count the snapshot used to take over the whole journal
    (last event failed, index not done), across a recovery too."""
    import random

    from agents.engine.doneset import DoneSet
    from agents.engine.journal import Journal, failed, requeued

    rng = random.Random(7)
    done = DoneSet(500)
    journal = Journal(tmp_path / "failures.jsonl")
    journal.recover()
    journal.watch_done(done)

    def scanned(j: Journal, d: DoneSet) -> int:
        return sum(1 for i, (ev, _, _) in j.state.last.items() if ev == "failed" and i not in d)

    for step in range(3000):
        i = rng.randrange(500)
        roll = rng.random()
        if roll < 0.4:
            journal.append([failed(i, "timeout", "x", 3, 0, attempt=rng.randint(1, 2))])
        elif roll < 0.6:
            journal.append([requeued(i, 2, "truncated")])
        else:
            done.add(i, rng.randint(1, 2))
        assert journal.failed_count() == scanned(journal, done), step
    journal.close()
    again = Journal(tmp_path / "failures.jsonl")
    again.recover()
    again.watch_done(done)
    assert again.failed_count() == scanned(again, done) > 0
