"""The failures summary (agents/rundir/failsummary.py, the `failures` RPC) against the lines
actually on disk: a real engine run against simulators told to fail a share of requests with
given statuses, a dead server and bad prompt lines, read while the engine appends and in
small bounded reads; then the reader's edges on hand-written journals (a torn last line, a
replaced file, a line longer than a read, more classes than the answer holds, a symlink)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from agents.rundir.failsummary import FailureSummarizer
from agents.rundir.schema import MAX_FAILURE_GROUPS, FailureSummary
from tests.agent.failures_disk import assert_matches_disk
from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.servers.ports import free_ports, wait_until
from tests.simserver import FAST_ARGS, start_sim


def read_through(s: FailureSummarizer, rounds: int = 10_000) -> FailureSummary:
    for _ in range(rounds):
        got = s.summary()
        if got.complete:
            return got
    raise AssertionError("the summary never read to the end")


def test_the_summary_of_a_real_run_is_what_failures_jsonl_holds(tmp_path: Path) -> None:
    # Server 0 answers 30% with HTTP 500 (a server fault), server 1 30% with HTTP 400 (the
    # request's fault), server 2 is down (nothing listens); every 40th prompt line is bad.
    s500 = start_sim(tmp_path, *FAST_ARGS, "--error-rate", "0.3", "--error-status", "500",
                     name="s500")
    s400 = start_sim(tmp_path, *FAST_ARGS, "--error-rate", "0.3", "--error-status", "400",
                     name="s400")
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    try:
        prompts = tmp_path / "prompts.jsonl"
        bad = write_prompts(prompts, 400, bad_every=40)
        spec = write_spec(tmp_path / "run.toml", prompts, [s500.url, s400.url, dead],
                          retries=1, concurrency_per_server=4)
        engine = start_engine(spec)
        journal = engine.run_dir / "failures.jsonl"
        # Small reads, while the engine appends: each call reads on from where it stopped.
        reader = FailureSummarizer(engine.run_dir, max_read_bytes=2048)
        seen: list[FailureSummary] = []

        def finished() -> bool:
            seen.append(reader.summary())
            return engine.proc.poll() is not None

        wait_until(finished, 300, "the engine's end", interval=0.05)
        assert engine.wait(60) == 0, engine.stderr()
    finally:
        s500.kill()
        s400.kill()
    steps = [b.bytes_read - a.bytes_read for a, b in itertools.pairwise(seen)]
    assert max(steps) <= 2048  # bounded work per call
    assert any(0 < s.bytes_read < s.bytes_total for s in seen), "never read partway"
    got = read_through(reader)
    assert got.bytes_read == got.bytes_total == journal.stat().st_size
    assert_matches_disk(got, journal)
    classes = {(g.event, g.error): g for g in got.groups}
    assert {("failed", "http_500"), ("failed", "http_400"), ("failed", "connect"),
            ("failed", "bad_input")} <= set(classes)
    assert classes[("failed", "bad_input")].count == len(bad)
    assert {s.server for s in classes[("failed", "http_500")].servers} == {0}
    assert {s.server for s in classes[("failed", "http_400")].servers} == {1}
    assert {s.server for s in classes[("failed", "connect")].servers} == {2}
    # A fresh reader (a new serve session) with the default budget: the same answer.
    assert FailureSummarizer(engine.run_dir).summary() == got
    # On the node itself: `fleetdeck-agent failures RUN_DIR [--json]`.
    r = subprocess.run([sys.executable, "-m", "agents.cli", "failures", str(engine.run_dir),
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert msgspec.convert(json.loads(r.stdout), FailureSummary) == got
    r = subprocess.run([sys.executable, "-m", "agents.cli", "failures", str(engine.run_dir)],
                       capture_output=True, text=True, timeout=120)
    count = classes[("failed", "http_500")].count
    assert r.returncode == 0 and f"failed http_500: {count}, first " in r.stdout, r.stdout


def _ev(i: int, error: str = "http_503", server: int | None = 0, t: float = 1000.0) -> bytes:
    return json.dumps({"event": "failed", "time": t + i, "index": i, "error": error,
                       "message": "m", "attempts": 1, "server": server}).encode() + b"\n"


def test_appends_a_torn_tail_and_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "failures.jsonl"
    reader = FailureSummarizer(tmp_path)
    assert reader.summary() == FailureSummary([], 0, 0, 0, 0, 0, 0, True, 0)  # no journal yet
    path.write_bytes(b"".join(_ev(i) for i in range(5)) + _ev(5)[:20])  # a line half written
    got = reader.summary()
    assert got.events == 5 and got.complete and got.bytes_read == len(path.read_bytes()) - 20
    with open(path, "ab") as f:
        f.write(_ev(5)[20:] + _ev(6, "timeout", server=None))
    got = reader.summary()
    assert got.events == 7 and got.bytes_read == got.bytes_total and got.lines == 7
    assert_matches_disk(got, path)
    # resume-from-s3 puts S3's copy in its place: another file, read from its start.
    other = tmp_path / "other.jsonl"
    other.write_bytes(_ev(0, "deadline", server=3))
    os.replace(other, path)
    got = reader.summary()
    assert [(g.error, g.count) for g in got.groups] == [("deadline", 1)]
    assert_matches_disk(got, path)


def test_a_line_longer_than_a_read_is_skipped_once(tmp_path: Path) -> None:
    path = tmp_path / "failures.jsonl"
    path.write_bytes(_ev(0) + b'{"event": "failed", "message": "' + b"x" * 5000 + b'"}\n' +
                     _ev(2))
    got = read_through(FailureSummarizer(tmp_path, max_read_bytes=1024))
    assert (got.events, got.unreadable, got.lines) == (2, 1, 3)
    assert [e.line for e in got.groups[0].examples] == [1, 3]


def test_classes_beyond_the_answer_are_counted_as_other(tmp_path: Path) -> None:
    path = tmp_path / "failures.jsonl"
    n = MAX_FAILURE_GROUPS + 36
    path.write_bytes(b"".join(_ev(i, f"http_{400 + i}", server=i) for i in range(n)) +
                     b"not json\n" + b'{"event": "failed", "time": "late"}\n')
    got = read_through(FailureSummarizer(tmp_path))
    assert len(got.groups) == MAX_FAILURE_GROUPS and got.other == 36
    assert got.events == n and got.unreadable == 2
    assert len(json.dumps(msgspec.to_builtins(got))) < 256 * 1024


def test_a_symlinked_journal_or_a_fifo_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.jsonl"
    secret.write_bytes(_ev(0))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "failures.jsonl").symlink_to(secret)
    with pytest.raises(OSError, match=r"failures\.jsonl"):
        FailureSummarizer(tmp_path / "run").summary()
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "failures.jsonl")  # a reader would block on it for ever
    with pytest.raises(OSError, match="not a regular file"):
        FailureSummarizer(fifo).summary()
