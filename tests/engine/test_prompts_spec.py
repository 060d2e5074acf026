"""Prompt parsing (both shapes) and run.toml validation: clear errors that name what and where."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.engine.prompts import BadPrompt, parse_prompt, scan
from agents.rundir.spec import SpecError, load_spec


def test_sharegpt_is_normalised_and_trailing_answer_dropped() -> None:
    p = parse_prompt(7, b'{"id": 42, "system": "Be brief.", "tools": "[{\\"name\\": \\"f\\"}]",'
                        b' "conversations": [{"from": "human", "value": "hi"},'
                        b' {"from": "gpt", "value": "old"}]}')
    assert p.index == 7 and p.id == "42"
    assert p.messages == [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "hi"}]
    assert p.tools == [{"type": "function", "function": {"name": "f"}}]


def test_openai_shape_with_tool_turns() -> None:
    p = parse_prompt(0, b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant",'
                        b' "content": null, "tool_calls": []}, {"role": "tool", "content": "r"}]}')
    assert [m["role"] for m in p.messages] == ["user", "assistant", "tool"]


@pytest.mark.parametrize("raw,why", [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"foo": 1}', "neither messages"),
    (b'{"conversations": [{"from": "alien", "value": "x"}]}', "unknown from"),
    (b'{"messages": [{"role": "assistant", "content": "only an answer"}]}', "no user turn"),
    (b'{"messages": [{"role": "user", "content": "q"}], "tools": "{bad"}', "not JSON"),
])
def test_bad_prompts_say_why(raw: bytes, why: str) -> None:
    with pytest.raises(BadPrompt, match=why):
        parse_prompt(0, raw)


def test_scan_counts_a_last_line_without_newline(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_bytes(b"a\nb\nc")
    assert scan(f)[1:] == (3, 5)


def _spec(tmp_path: Path, body: str) -> Path:
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "q"}]}\n')
    path = tmp_path / "run.toml"
    path.write_text('[run]\nname = "r"\n[servers]\nurls = ["http://127.0.0.1:1"]\n'
                    '[generate]\nprompts = "p.jsonl"\n' + body)
    return path


@pytest.mark.parametrize("body,message", [
    ("colour = 3\n", r"unknown field `colour` - at \[generate\]"),
    ('max_tokens = "lots"\n', r"Expected `int`, got `str` - at \[generate\] max_tokens"),
    ("batch_size = 0\n", r"\[generate\] batch_size: must be at least 1"),
    ("[s3]\nbucket = \"b\"\nregoin = \"x\"\n", r"unknown field `regoin` - at \[s3\]"),
])
def test_bad_spec_names_file_and_key(tmp_path: Path, body: str, message: str) -> None:
    path = _spec(tmp_path, body)
    with pytest.raises(SpecError, match=message) as err:
        load_spec(path)
    assert str(path) in str(err.value)


def test_missing_prompts_file_is_named(tmp_path: Path) -> None:
    path = _spec(tmp_path, "")
    (tmp_path / "p.jsonl").unlink()
    with pytest.raises(SpecError, match=r"\[generate\] prompts: no such file: .*p.jsonl"):
        load_spec(path)


def test_relative_paths_are_relative_to_the_spec(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, ""))
    assert spec.prompts_path == tmp_path / "p.jsonl"
    assert spec.run_dir == tmp_path


@pytest.mark.parametrize("body", [
    b'{"choices": [{"message": "x"}]}',
    b'{"choices": [{"message": {"content": "a"}}], "usage": 5}',
    b'{"choices": [{"message": {"content": 7}}]}',
    b'{"choices": []}',
    b'<html>bad gateway</html>',
    b'{"choices": [{"message": {"content": "a", "tool_calls": "call"}}]}',
])
def test_a_200_that_is_not_a_chat_completion_is_a_retryable_bad_response(body: bytes) -> None:
    from agents.engine.client import RequestFailed, parse_response

    with pytest.raises(RequestFailed) as err:
        parse_response(200, body, 0.1)
    assert err.value.error == "bad_response" and err.value.retryable and err.value.server_fault
