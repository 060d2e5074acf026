"""Reading a run directory for people (logs, samples, history) never freezes, never follows a
symlink, never dies on one bad line, and `logs` takes a log *name*, never a path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.rundirs import copy_run, finished_run, finished_work
from tests.agent.stdio import request, serve


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_run(tmp_path_factory.mktemp("made"))


@pytest.fixture
def run_dir(made: Path, tmp_path: Path) -> Iterator[Path]:
    run = copy_run(made, tmp_path / "run")
    before = finished_work(run)
    yield run
    assert finished_work(run) == before, "finished work changed"


def test_a_fifo_in_logs_does_not_freeze_the_agent(run_dir: Path) -> None:
    os.mkfifo(run_dir / "logs" / "x.log")
    out = serve(run_dir, request(1, "logs", name="x"), request(2, "hello", protocol=1),
                timeout=180)
    assert out.code == 0, out.stderr
    err = out.by_id(1)["error"]
    assert err["code"] == -32002 and "not a regular file" in err["message"], err
    assert out.by_id(2)["result"]["protocol"] == 1
    assert "Traceback" not in out.stderr


def test_logs_takes_a_log_name_never_a_path(run_dir: Path) -> None:
    (run_dir / "logs" / "generate.log").write_text("line one\nline two\n")
    out = serve(run_dir, request(1, "logs", name="./run.toml"),
                request(2, "logs", name="logs/generate.log"),
                request(3, "logs", name="../run/run.toml"),
                request(4, "logs", name="generate", n=1),
                request(5, "logs", name="generate.log", n=2),
                request(6, "logs", name="nope"))
    assert out.code == 0, out.stderr
    for rid in (1, 2, 3):
        err = out.by_id(rid)["error"]
        assert err["code"] == -32002, err
        assert "generate" in err["message"], err  # it says which logs there are
    assert "urls" not in str(out.replies[:3])
    assert out.by_id(4)["result"]["lines"] == ["line two"]
    assert out.by_id(5)["result"]["lines"] == ["line one", "line two"]
    assert "no such log" in out.by_id(6)["error"]["message"]


def test_samples_and_history_do_not_follow_symlinks(run_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret_line = ('{"index": 7, "finish_reason": "stop", "content": "OUTSIDE-SECRET", '
                   '"usage": {}}\n')
    (outside / "completions_000009.jsonl").write_text(secret_line)
    (outside / "history.jsonl").write_text('{"updated_at": 5000, "note": "OUTSIDE-SECRET"}\n')
    (run_dir / "completions" / "completions_000009.jsonl").symlink_to(
        outside / "completions_000009.jsonl")
    (run_dir / "history.jsonl").unlink()
    (run_dir / "history.jsonl").symlink_to(outside / "history.jsonl")
    out = serve(run_dir, request(1, "samples", n=5), request(2, "history"))
    assert out.code == 0, out.stderr
    samples = out.by_id(1)["result"]["samples"]
    assert len(samples) == 5 and "OUTSIDE-SECRET" not in str(samples)
    hist = out.by_id(2)["result"]
    assert hist["items"] == [] and "symbolic link" in hist["refused"]
    # A whole completions folder that is a link to elsewhere is not read either.
    comp = run_dir / "completions"
    comp.rename(run_dir / "completions.real")
    comp.symlink_to(outside)
    out = serve(run_dir, request(1, "samples", n=5))
    assert out.by_id(1)["result"]["samples"] == []
    comp.unlink()
    (run_dir / "completions.real").rename(comp)


def test_one_bad_history_line_is_skipped_and_counted(run_dir: Path) -> None:
    (run_dir / "history.jsonl").write_text(
        '{"updated_at": 1, "completed": 1}\n5\n{"updated_at": "x"}\n[1, 2]\nnot json\n'
        + "[" * 5000 + "]" * 5000 + "\n" + '{"updated_at": 2, "completed": 2}\n')
    out = serve(run_dir, request(1, "history"), request(2, "history", since=1))
    assert out.code == 0, out.stderr
    first = out.by_id(1)["result"]
    assert [i["completed"] for i in first["items"]] == [1, 2]
    assert first["bad_lines"] == 5
    assert [i["completed"] for i in out.by_id(2)["result"]["items"]] == [2]


def test_a_deeply_nested_request_gets_an_error_and_the_session_goes_on(run_dir: Path) -> None:
    deep = b'{"jsonrpc": "2.0", "id": 1, "method": "status", "params": {"x": ' + \
        b"[" * 100_000 + b"]" * 100_000 + b"}}\n"
    out = serve(run_dir, deep, request(2, "hello", protocol=1), request(3, "status"))
    assert out.code == 0, out.stderr
    assert "Traceback" not in out.stderr and "RecursionError" not in out.stderr
    errors = [r for r in out.replies if "error" in r]
    assert errors and errors[0]["error"]["code"] == -32700
    assert "nested" in errors[0]["error"]["message"]
    assert out.by_id(2)["result"]["protocol"] == 1
    assert out.by_id(3)["result"]["progress"]["completed"] == 40


@pytest.mark.parametrize("kind", ["fifo", "folder", "symlink"])
def test_status_from_disk_survives_an_odd_progress_json(run_dir: Path, tmp_path: Path,
                                                        kind: str) -> None:
    progress = run_dir / "progress.json"
    progress.unlink()
    if kind == "fifo":
        os.mkfifo(progress)  # reading it whole would wait for a writer for ever
    elif kind == "folder":
        progress.mkdir()
    else:
        (tmp_path / "elsewhere.json").write_text('{"total": 1}')
        progress.symlink_to(tmp_path / "elsewhere.json")
    out = serve(run_dir, request(1, "hello", protocol=1), request(2, "status"), timeout=180)
    assert out.code == 0 and "Traceback" not in out.stderr, out.stderr
    snap = out.by_id(2)["result"]
    assert snap["progress"] is None, snap
