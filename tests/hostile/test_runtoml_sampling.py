"""`[generate.sampling]` keys SGLang would ignore or refuse: each row runs the real `fleetdeck-agent
generate` on one and expects exit 2 naming the file and the key, nothing written. SGLang's
request model drops a field it does not know without a word (a typo samples with the server's
defaults all run long) and answers 400 to every prompt for a value of the wrong type; the
real-server tier (`tests/real/test_engine_real.py`) checks the keys against SGLang's own model.
A row with every key at a good value loads."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from agents.rundir.sampling import SAMPLING_KEYS
from tests.hostile.conftest import assert_only_changed, assert_refused, run_cli, tree


def spec_text(sampling: str) -> str:
    return "\n".join(["[run]", 'name = "sampling"', 'dir = "run"', "", "[servers]",
                      'urls = ["http://127.0.0.1:9"]', "", "[generate]",
                      'prompts = "prompts.jsonl"', "", "[generate.sampling]", sampling, ""])


BAD = [
    pytest.param("temprature = 0.6", "temprature", "not a sampling parameter", id="typo"),
    pytest.param("stream = true", "stream", "the engine reads whole answers", id="stream"),
    pytest.param("max_tokens = 64", "max_tokens", "set [generate] max_tokens", id="max-tokens"),
    pytest.param("rid = \"x\"", "rid", "the engine names every request", id="rid"),
    pytest.param("n = 2", "n", "a line holds one answer", id="n"),
    pytest.param('temperature = "hot"', "temperature", "must be a finite number", id="type"),
    pytest.param("top_p = nan", "top_p", "must be a finite number", id="nan"),
    pytest.param("ignore_eos = 1", "ignore_eos", "must be true or false", id="bool"),
    pytest.param("stop_token_ids = [1, \"2\"]", "stop_token_ids", "a list of integers",
                 id="token-ids"),
]

GOOD = "\n".join([
    "temperature = 0.7", "top_p = 0.9", "top_k = 5", "min_p = 0.05", "frequency_penalty = 0.1",
    "presence_penalty = 0.1", "repetition_penalty = 1.1", "seed = 3", "min_tokens = 1",
    "ignore_eos = false", "skip_special_tokens = true", "no_stop_trim = false",
    'stop = ["zzzz"]', 'stop_regex = "zzzz"', "stop_token_ids = [5]", 'logit_bias = { "5" = -1.0 }',
    'regex = "[a-z ]+"', "ebnf = 'root ::= \"a\" | \"b\"'", 'response_format = { type = "text" }',
    'tool_choice = "none"', "parallel_tool_calls = true", 'reasoning_effort = "low"',
])


def _setup(tmp_path: Path, text: str) -> Path:
    (tmp_path / "prompts.jsonl").write_text("")
    spec = tmp_path / "run.toml"
    spec.write_text(text)
    return spec


@pytest.mark.parametrize(("sampling", "key", "why"), BAD)
def test_a_sampling_key_sglang_would_ignore_or_refuse_is_refused_at_load(
        tmp_path: Path, home: Path, sampling: str, key: str, why: str) -> None:
    spec = _setup(tmp_path, spec_text(sampling))
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "generate", spec, env={"HOME": str(home)})
    assert_refused(out, 2, [str(spec), f"[generate.sampling] {key}", why])
    assert_only_changed(before, tree(tmp_path))


def test_every_sampling_key_at_a_good_value_loads(tmp_path: Path, home: Path) -> None:
    assert set(tomllib.loads(GOOD)) == set(SAMPLING_KEYS)
    spec = _setup(tmp_path, spec_text(GOOD))
    out = run_cli("fleetdeck-agent", "generate", spec, env={"HOME": str(home)})
    # Loaded: refused only for the empty prompts file, after the spec checks.
    assert_refused(out, 2, ["prompts file is empty", str(tmp_path / "prompts.jsonl")])
