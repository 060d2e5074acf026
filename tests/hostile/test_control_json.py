"""Broken control.json files: the engine (`fleetdeck-agent generate`) keeps the last good control,
says so, and finishes the run; the control verbs refuse with exit 2 naming the file. Each row
asserts the exit code, the message, no traceback, nothing written outside the run directory
and no finished work lost (issue 11, item 12)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.hostile.conftest import Outcome, assert_only_changed, assert_refused, run_cli, tree
from tests.servers.ports import kill_pid
from tests.simserver import FAST_ARGS, SimHandle, start_sim

PROMPTS = 12


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    folder = tmp_path_factory.mktemp("sim")
    handle = start_sim(folder, *FAST_ARGS)
    yield handle
    kill_pid(handle.proc)


def write_run(tmp_path: Path, sim: SimHandle) -> Path:
    lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]})
             for i in range(PROMPTS)]
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    spec = tmp_path / "run.toml"
    spec.write_text("[run]\nname = \"hostile-control\"\ndir = \"run\"\n\n[servers]\n"
                    f"urls = [\"{sim.url}\"]\n\n[generate]\nprompts = \"prompts.jsonl\"\n"
                    "max_tokens = 32\nbatch_size = 5\nconcurrency_per_server = 3\n")
    (tmp_path / "run").mkdir()
    return spec


def lines_of(run_dir: Path) -> dict[int, bytes]:
    out = {}
    for batch in sorted((run_dir / "completions").glob("completions_*.jsonl")):
        for raw in batch.read_bytes().splitlines():
            out[json.loads(raw)["index"]] = raw
    return out


def _text(data: bytes) -> Callable[[Path], None]:
    def put(path: Path) -> None:
        path.write_bytes(data)
    return put


def _folder(path: Path) -> None:
    path.mkdir()


def _symlink_out(path: Path) -> None:
    outside = path.parent.parent / "outside.json"
    outside.write_text('{"rev": 9, "concurrency": {"default": 1}, "max_tokens": 5}\nnot json\n')
    path.symlink_to(outside)


GOOD = {"rev": 2, "concurrency": {"default": 3}, "max_tokens": 32}

BROKEN = [
    pytest.param(_text(json.dumps(GOOD).encode()[:17]), "truncated", id="truncated"),
    pytest.param(_text(b""), "truncated", id="empty"),
    pytest.param(_text(b"\x00\xff\xfe binary"), "invalid", id="binary"),
    pytest.param(_text(b"[1, 2]"), "Expected `object`", id="json-array"),
    pytest.param(_text(json.dumps({**GOOD, "max_tokens": "lots"}).encode()),
                 "Expected `int`", id="wrong-type"),
    pytest.param(_text(json.dumps({**GOOD, "colour": "red"}).encode()), "unknown field",
                 id="unknown-field"),
    pytest.param(_text(json.dumps({**GOOD, "concurrency": {"default": -4}}).encode()),
                 "must not be negative", id="negative-concurrency"),
    pytest.param(_text(json.dumps({**GOOD, "concurrency": {"default": 3, "servers":
                                                           {"0": -1}}}).encode()),
                 "must not be negative", id="negative-server-concurrency"),
    pytest.param(_text(json.dumps({**GOOD, "max_tokens": 0}).encode()), "at least 1",
                 id="max-tokens-0"),
    pytest.param(_text(b'{"rev": ' + b"[" * 5000 + b"]" * 5000 + b"}"), "Expected `int`",
                 id="deeply-nested"),
    pytest.param(_folder, "Is a directory", id="a-folder"),
    pytest.param(_symlink_out, "malformed", id="symlink-to-garbage-outside"),
]


@pytest.mark.parametrize(("make", "why"), BROKEN)
def test_the_engine_runs_on_and_finishes(tmp_path: Path, sim: SimHandle,
                                         make: Callable[[Path], None], why: str) -> None:
    spec = write_run(tmp_path, sim)
    control = tmp_path / "run" / "control.json"
    make(control)
    kept = control.read_bytes() if control.is_file() else None
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(out, 0, ["control.json ignored", why, "keeps the last good control",
                            "engine exits with status done"])
    assert sorted(lines_of(tmp_path / "run")) == list(range(PROMPTS))
    assert_only_changed(before, tree(tmp_path), allowed=["run/"])
    # The broken file is the operator's to mend: the engine did not overwrite it.
    assert (control.read_bytes() if control.is_file() else None) == kept


def test_a_resume_on_a_truncated_control_json_keeps_the_last_good_one(tmp_path: Path,
                                                                      sim: SimHandle) -> None:
    spec = write_run(tmp_path, sim)
    (tmp_path / "prompts.jsonl").write_text(
        (tmp_path / "prompts.jsonl").read_text() + "not json\n")
    first = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(first, 0, [])
    run_dir = tmp_path / "run"
    done = lines_of(run_dir)
    progress = json.loads((run_dir / "progress.json").read_text())
    control = run_dir / "control.json"
    control.write_bytes(control.read_bytes()[:-9])
    before = tree(tmp_path)
    again = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(again, 0, ["control.json ignored",
                              f"rev {progress['control_rev']}: max_tokens 32, concurrency 3"])
    assert lines_of(run_dir) == done, "finished work changed"
    assert_only_changed(before, tree(tmp_path), allowed=["run/"])


VERBS = [
    pytest.param(["max-tokens", "RUN", "100"], _text(b'{"rev": 3, "conc'), "truncated",
                 id="max-tokens-on-truncated"),
    pytest.param(["resize", "RUN", "4"], _folder, "Is a directory", id="resize-on-a-folder"),
    pytest.param(["pause", "RUN"], _text(b"garbage"), "invalid", id="pause-on-garbage"),
    pytest.param(["retry", "RUN", "failed"], _text(b'{"rev": "x"}'), "Expected `int`",
                 id="retry-on-wrong-type"),
]


@pytest.mark.parametrize(("args", "make", "why"), VERBS)
def test_a_control_verb_on_a_broken_file_is_refused(tmp_path: Path, args: list[str],
                                                    make: Callable[[Path], None],
                                                    why: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    control = run_dir / "control.json"
    make(control)
    kept = control.read_bytes() if control.is_file() else None
    before = tree(tmp_path)
    out: Outcome = run_cli("fleetdeck-agent", *[str(run_dir) if a == "RUN" else a
                                                for a in args])
    assert_refused(out, 2, [str(control), why])
    assert_only_changed(before, tree(tmp_path), allowed=["run/control.lock"])
    assert not (run_dir / "control.log.jsonl").exists(), "a refused change was audited"
    assert (control.read_bytes() if control.is_file() else None) == kept
