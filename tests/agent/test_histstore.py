"""The history store (agents/rundir/histstore.py): a run's history.jsonl served at 10 s for
the last hour, 1 min for the day and 10 min beyond, from a compacted copy kept beside it;
a torn line never breaks a read, a lost or corrupt copy is rebuilt, and a reply is bounded."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from agents.rundir.histstore import COMPACT, HistoryError, HistoryStore, read_history
from tests.agent.histories import STEP_S, sample, write_history
from tests.agent.stdio import request, serve

T0 = 1_700_000_000.0  # a minute boundary
HOURS20 = int(20 * 3600 / STEP_S)


def expected_buckets(samples: list[dict[str, Any]], step: float) -> dict[float, dict[str, Any]]:
    """Buckets computed straight from the samples: the mean tok/s, the last completed, the
    highest in flight."""
    groups: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        groups[math.floor(s["updated_at"] / step) * step].append(s)
    return {start: {"tok0": sum(s["servers"]["0"]["tok_per_s"] for s in g) / len(g),
                    "completed": g[-1]["completed"], "in_flight": max(s["in_flight"] for s in g),
                    "samples": len(g)}
            for start, g in groups.items()}


def check_bucket(item: dict[str, Any], want: dict[str, Any]) -> None:
    assert item["samples"] == want["samples"], item["bucket_start"]
    assert item["servers"]["0"]["tok_per_s"] == pytest.approx(want["tok0"], abs=1e-3)
    assert item["completed"] == want["completed"]
    assert item["in_flight"] == want["in_flight"]


@pytest.fixture
def run20(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    run = tmp_path / "run"
    run.mkdir()
    return run, write_history(run / "history.jsonl", T0, HOURS20)


def test_a_20_hour_history_is_served_at_the_span_s_step(
        run20: tuple[Path, list[dict[str, Any]]]) -> None:
    run, samples = run20
    newest = samples[-1]["updated_at"]
    store = HistoryStore(run)

    hour = store.window("1h")
    assert hour.step_s == 10 and hour.until == newest
    assert len(hour.items) == 360
    assert all(i["bucket_s"] == 10 and i["samples"] == 1 for i in hour.items)
    assert hour.items[0]["updated_at"] > newest - 3600
    assert [i["completed"] for i in hour.items] == [s["completed"] for s in samples[-360:]]

    six = store.window("6h")
    assert six.step_s == 60 and len(six.items) == 360
    want = expected_buckets([s for s in samples if s["updated_at"] > newest - 6 * 3600], 60)
    for item in six.items:
        assert item["bucket_s"] == 60
        check_bucket(item, want[item["bucket_start"]])

    # The whole run at 1 min is 1,200 points: over the limit, so 2 min (and never coarser
    # than it needs); every sample counted once.
    whole = store.window("all", limit=1000)
    assert whole.step_s == 120 and 590 <= len(whole.items) <= 601 and not whole.more
    assert sum(i["samples"] for i in whole.items) == len(samples)
    want = expected_buckets(samples, 120)
    for item in whole.items:
        check_bucket(item, want[item["bucket_start"]])
    assert whole.items[0]["first_at"] == samples[0]["updated_at"]


def test_past_a_day_the_run_is_kept_at_10_min(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    samples = write_history(run / "history.jsonl", T0, int(30 * 3600 / STEP_S))
    newest = samples[-1]["updated_at"]
    got = HistoryStore(run).window("all", limit=5000)
    assert got.step_s == 30
    by_age = {(i["bucket_s"], newest - i["updated_at"] < 3600,
               newest - i["updated_at"] > 86400 + 600) for i in got.items}
    assert (600, False, True) in by_age and (60, False, False) in by_age \
        and (30, True, False) in by_age
    assert all(i["bucket_s"] == 600 for i in got.items
               if newest - i["updated_at"] > 86400 + 600)
    assert sum(i["samples"] for i in got.items) == len(samples)
    # The copy on disk: 10 min beyond the day, 1 min within it; bounded however long the run.
    lines = [json.loads(x) for x in (run / COMPACT).read_text().splitlines()]
    assert {r["bucket_s"] for r in lines} == {60, 600}
    assert len(lines) <= 24 * 60 + 6 * 6 + 1 + 60


def test_a_live_run_compacts_as_it_goes_and_matches_a_rebuild(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    live = HistoryStore(run)
    samples: list[dict[str, Any]] = []
    for block in range(40):  # 40 blocks of 37 samples: minutes close mid-block
        samples += write_history(run / "history.jsonl", T0, 37, first=block * 37)
        live.window("1h")
    grown = (run / COMPACT).read_bytes()
    (run / COMPACT).unlink()
    rebuilt = HistoryStore(run)
    for span in ("1h", "6h", "all"):
        assert rebuilt.window(span).items == live.window(span).items, span
    assert (run / COMPACT).read_bytes() == grown


def test_a_torn_line_never_breaks_a_read(run20: tuple[Path, list[dict[str, Any]]]) -> None:
    run, samples = run20
    store = HistoryStore(run)
    before = store.window("6h").items
    # The engine died mid-line: the half line is left, not counted bad, not served.
    with open(run / "history.jsonl", "a") as f:
        f.write('{"total": 1000000, "completed": 99999, "upd')
    got = store.window("6h")
    assert got.items == before and got.bad_lines == 0
    # Its writer finishes the line: it is read then (a new minute closes the old one).
    with open(run / "history.jsonl", "a") as f:
        f.write(f'ated_at": {samples[-1]["updated_at"] + 60}}}\n')
    got = store.window("1h")
    assert got.items[-1]["completed"] == 99999 and got.bad_lines == 0

    # A torn end of the copy: a new process repairs it and serves the same.
    with open(run / COMPACT, "ab") as f:
        f.write(b'{"bucket_s": 60, "upd')
    again = HistoryStore(run).window("6h")
    assert again.items == store.window("6h").items
    assert (run / COMPACT).read_bytes().endswith(b"\n")


@pytest.mark.parametrize("spoil", ["missing", "garbage", "reordered", "a directory"])
def test_a_lost_or_corrupt_copy_is_rebuilt(run20: tuple[Path, list[dict[str, Any]]],
                                           spoil: str) -> None:
    run, _ = run20
    want = HistoryStore(run).window("all", limit=5000).items
    copy = run / COMPACT
    lines = copy.read_text().splitlines(keepends=True)
    if spoil == "missing":
        copy.unlink()
    elif spoil == "garbage":
        lines[len(lines) // 2] = "\x00\x00 not json\n"
        copy.write_text("".join(lines))
    elif spoil == "reordered":
        lines[3], lines[4] = lines[4], lines[3]
        copy.write_text("".join(lines))
    else:
        copy.unlink()
        copy.mkdir()
    got = HistoryStore(run).window("all", limit=5000).items
    if spoil == "a directory":  # not replaced by us: served from memory, the same
        assert got == want
        return
    assert got == want
    assert copy.read_text().splitlines(keepends=True) == lines if spoil == "missing" else True
    assert [json.loads(x)["bucket_start"] for x in copy.read_text().splitlines()] == \
        sorted(json.loads(x)["bucket_start"] for x in copy.read_text().splitlines())


def test_bad_window_parameters_are_named(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path)
    for kwargs, word in (({"span": "2d"}, "span"), ({"resolution": 15}, "resolution"),
                         ({"limit": 0}, "limit")):
        with pytest.raises(HistoryError, match=word):
            store.window(**kwargs)
    assert store.window("all").items == []  # no history yet: nothing, no error


def test_the_history_rpc_serves_a_span_bounded(run20: tuple[Path, list[dict[str, Any]]]
                                               ) -> None:
    run, samples = run20
    (run / COMPACT).unlink(missing_ok=True)
    out = serve(run, request(1, "history", span="all", limit=50),
                request(2, "history", span="6h", limit=100000),
                request(3, "history", span="week"),
                request(4, "history", span="1h", resolution=7),
                request(5, "history", limit=3))
    assert out.code == 0, out.stderr
    whole = out.by_id(1)["result"]
    assert len(whole["items"]) <= 50 and whole["step_s"] == 1800
    assert sum(i["samples"] for i in whole["items"]) == len(samples)
    assert len(json.dumps(whole)) < 50 * 4096
    six = out.by_id(2)["result"]
    assert six["step_s"] == 60 and len(six["items"]) == 360  # asked 100,000: 5,000 at most
    assert "span must be one of 1h, 6h, all" in out.by_id(3)["error"]["message"]
    assert "resolution" in out.by_id(4)["error"]["message"]
    # Without a span: the samples as written, paged, as before.
    old = out.by_id(5)["result"]
    assert [i["completed"] for i in old["items"]] == [0, 3, 6] and old["more"]
    assert (run / COMPACT).exists()  # the answering process made the copy


def test_an_endless_line_is_skipped_and_counted_not_held(tmp_path: Path) -> None:
    samples = write_history(tmp_path / "history.jsonl", T0, 30)
    with open(tmp_path / "history.jsonl", "ab") as f:
        f.write(b'{"updated_at": 1, "x": "' + b"y" * (6 << 20) + b'"}\n')
    write_history(tmp_path / "history.jsonl", T0, 30, first=30)
    got = HistoryStore(tmp_path).window("1h")
    assert got.bad_lines == 1 and len(got.items) == 60
    assert got.items[29]["completed"] == samples[-1]["completed"]


def test_read_history_refuses_a_symlinked_history(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    write_history(outside, T0, 10)
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.jsonl").symlink_to(outside)
    got = read_history(run, "all")
    assert got.items == [] and got.refused is not None and "symbolic link" in got.refused


def test_all_is_never_empty_past_the_coarsest_step(tmp_path: Path) -> None:
    """One bogus early sample (a clock at 1970) puts the run's start 50 years back: even one
    day per point is too fine for the limit, and the coarsest step is served all the same."""
    with open(tmp_path / "history.jsonl", "w") as f:
        f.write(json.dumps(sample(0, 1.0)) + "\n")
    samples = write_history(tmp_path / "history.jsonl", T0, 360, first=1)
    got = HistoryStore(tmp_path).window("all", limit=1000)
    assert got.step_s == 86400 and not got.more
    assert sum(i["samples"] for i in got.items) == len(samples) + 1
    assert got.items[0]["first_at"] == 1.0
    assert got.items[-1]["completed"] == samples[-1]["completed"]
    # Fewer points than the coarsest fold gives: its newest, and `more` says so.
    one = HistoryStore(tmp_path).window("all", limit=1)
    assert one.more and len(one.items) == 1
    assert one.items[0]["completed"] == samples[-1]["completed"]
