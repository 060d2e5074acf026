"""Broken and hostile prompts files: each row runs the real `fleetdeck-agent generate` against a
simulated server on one, and expects its exit code, the problem named (in what the user reads
and, for a bad line, as that index's `bad_input` reason in failures.jsonl), no traceback,
nothing written outside the run directory, and every good line generated: one bad line never
stops the run (issue 11, item 11)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.conftest import assert_only_changed, assert_refused, run_cli, tree
from tests.servers.ports import kill_pid
from tests.simserver import FAST_ARGS, SimHandle, start_sim

GOOD = [json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}).encode()
        for i in range(12)]


def deep(depth: int) -> bytes:
    return b'{"messages":[{"role":"user","content":' + b"[" * depth + b"]" * depth + b"}]}"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    folder = tmp_path_factory.mktemp("sim")
    handle = start_sim(folder, *FAST_ARGS)
    yield handle
    kill_pid(handle.proc)


def write_run(tmp_path: Path, sim: SimHandle, prompts: bytes, **generate: object) -> Path:
    (tmp_path / "prompts.jsonl").write_bytes(prompts)
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in generate.items())
    spec = tmp_path / "run.toml"
    spec.write_text("[run]\nname = \"hostile-prompts\"\ndir = \"run\"\n\n[servers]\n"
                    f"urls = [\"{sim.url}\"]\n\n[generate]\nprompts = \"prompts.jsonl\"\n"
                    f"max_tokens = 32\nbatch_size = 5\n{extra}")
    return spec


def with_bad(line: bytes, at: int = 5) -> bytes:
    """The good lines with `line` in place of line `at` (0-based index)."""
    lines = list(GOOD)
    lines[at] = line
    return b"\n".join(lines) + b"\n"


def outcome_of(run_dir: Path) -> tuple[set[int], dict[int, str]]:
    """Indices with a batch line, and index -> bad_input reason."""
    done = set()
    for batch in (run_dir / "completions").glob("completions_*.jsonl"):
        done |= {json.loads(x)["index"] for x in batch.read_text().splitlines()}
    bad = {}
    failures = run_dir / "failures.jsonl"
    if failures.exists():
        for raw in failures.read_text().splitlines():
            ev = json.loads(raw)
            if ev.get("error") == "bad_input":
                bad[ev["index"]] = ev["message"]
    return done, bad


BAD_LINES = [
    pytest.param(deep(3_000), "nested too deeply", id="nested-3000"),
    pytest.param(deep(100_000), "nested too deeply", id="nested-100000"),
    pytest.param(deep(300), "levels deep, over 200", id="nested-300-decodable"),
    pytest.param(json.dumps({"messages": [{"role": "user", "content": "q"}],
                             "tools": "[" * 4000 + "]" * 4000}).encode(),
                 "tools is a string of JSON nested", id="tools-string-nested"),
    pytest.param(b'{"messages": [{"role": "user", "content": "' + b"x" * 400_000 + b'"}]}',
                 "over [generate] max_prompt_bytes (300,000)", id="over-max-prompt-bytes"),
    pytest.param(b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "not valid JSON",
                 id="not-utf8"),
    pytest.param(b'{"messages": [{"role": "user", "content": "a\x00b"}]}', "not valid JSON",
                 id="nul-byte"),
    pytest.param(rb'{"messages": [{"role": "user", "content": "a\ud800b"}]}',
                 "not valid JSON", id="lone-surrogate"),
    pytest.param(b'{"messages": [{"role": "user", "content": "q"}], "id": 1e999}',
                 "not valid JSON", id="number-out-of-range"),
    pytest.param(b"[1, 2, 3]", "not a JSON object", id="json-array"),
    pytest.param(b"", "not valid JSON", id="blank-line"),
    pytest.param(b"{}", "neither messages", id="empty-object"),
    pytest.param(b'{"messages": "hello"}', "messages must be a non-empty list",
                 id="messages-not-a-list"),
    pytest.param(b'{"conversations": [{"from": "\\u001b[2J", "value": "x"}]}', "unknown from",
                 id="unknown-role-with-escape"),
    pytest.param(b'{"messages": [{"role": "assistant", "content": "only an answer"}]}',
                 "no user turn", id="no-user-turn"),
]


@pytest.mark.parametrize(("line", "why"), BAD_LINES)
def test_one_bad_line_is_that_index_bad_input_and_the_run_finishes(
        tmp_path: Path, sim: SimHandle, line: bytes, why: str) -> None:
    spec = write_run(tmp_path, sim, with_bad(line), max_prompt_bytes=300_000)
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(out, 0, ["line 6 (index 5): bad_input", why])
    done, bad = outcome_of(tmp_path / "run")
    assert done == set(range(12)) - {5}, "a good line was not generated"
    assert list(bad) == [5] and bad[5].startswith("line 6: ") and why in bad[5]
    assert "\x1b" not in out.text, "a control character from the file reached the terminal"
    assert_only_changed(before, tree(tmp_path), allowed=["run/"])
    # A resume does not stumble on it again, and loses nothing.
    again = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(again, 0, [])
    assert outcome_of(tmp_path / "run") == (done, bad)


def sized(n: int) -> bytes:
    """A valid prompt line of exactly n bytes."""
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}]}'
    return head + b"y" * (n - len(head) - len(tail)) + tail


ACCEPTED = [
    pytest.param(b"\xef\xbb\xbf" + b"\n".join(GOOD) + b"\n", id="utf8-bom"),
    pytest.param(b"\r\n".join(GOOD) + b"\r\n", id="crlf-line-ends"),
    pytest.param(b"\n".join(GOOD), id="no-newline-at-the-end"),
    pytest.param(b"\n".join([*GOOD[:11], sized(4096)]) + b"\n", id="a-line-at-the-limit"),
]


@pytest.mark.parametrize("prompts", ACCEPTED)
def test_odd_but_valid_files_are_generated_whole(tmp_path: Path, sim: SimHandle,
                                                 prompts: bytes) -> None:
    spec = write_run(tmp_path, sim, prompts, max_prompt_bytes=4096)
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(out, 0, ["engine exits with status done"])
    done, bad = outcome_of(tmp_path / "run")
    assert bad == {} and done == set(range(12)), (bad, out.text)
    assert_only_changed(before, tree(tmp_path), allowed=["run/"])


REFUSED = [
    pytest.param(b"", "the prompts file is empty", id="empty-file"),
    pytest.param(b"\n \n\t\n", "the prompts file is empty", id="whitespace-only"),
    pytest.param(b"\xef\xbb\xbf\n", "the prompts file is empty", id="bom-only"),
]


@pytest.mark.parametrize(("prompts", "why"), REFUSED)
def test_a_file_with_no_prompts_is_refused_at_start(tmp_path: Path, sim: SimHandle,
                                                    prompts: bytes, why: str) -> None:
    spec = write_run(tmp_path, sim, prompts)
    out = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(out, 2, [why, str(tmp_path / "prompts.jsonl")])
    assert not (tmp_path / "run" / "run.pin.json").exists()
    assert "status done" not in out.text


def test_a_prompts_path_that_is_a_folder_is_refused(tmp_path: Path, sim: SimHandle) -> None:
    spec = write_run(tmp_path, sim, b"")
    (tmp_path / "prompts.jsonl").unlink()
    (tmp_path / "prompts.jsonl").mkdir()
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "generate", spec)
    assert_refused(out, 2, ["[generate] prompts", str(tmp_path / "prompts.jsonl")])
    assert_only_changed(before, tree(tmp_path))
