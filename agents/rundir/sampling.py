"""`[generate] sampling`: the keys a run may set, checked at load. They go into every chat
request as they are, and SGLang's request model ignores a field it does not know without a
word (a typo would sample with the server's defaults all run long), while a value of the
wrong type is a 400 for every prompt. The keys are SGLang 0.5's `ChatCompletionRequest`
fields that shape an answer; the real-server tier checks each against the server's model."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def _number(v: Any) -> bool:
    # TOML allows nan and inf; JSON has neither (msgspec would send null).
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _text_or_texts(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(_int(x) for x in v)


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _table(v: Any) -> bool:
    return isinstance(v, dict)


def _text_or_table(v: Any) -> bool:
    return isinstance(v, str | dict)


def _text_or_number(v: Any) -> bool:
    return isinstance(v, str) or _number(v)


# key -> (what its value must be, the check)
SAMPLING_KEYS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "temperature": ("a finite number", _number),
    "top_p": ("a finite number", _number),
    "top_k": ("an integer", _int),
    "min_p": ("a finite number", _number),
    "frequency_penalty": ("a finite number", _number),
    "presence_penalty": ("a finite number", _number),
    "repetition_penalty": ("a finite number", _number),
    "seed": ("an integer", _int),
    "min_tokens": ("an integer", _int),
    "ignore_eos": ("true or false", _bool),
    "skip_special_tokens": ("true or false", _bool),
    "no_stop_trim": ("true or false", _bool),
    "stop": ("a string or a list of strings", _text_or_texts),
    "stop_regex": ("a string or a list of strings", _text_or_texts),
    "stop_token_ids": ("a list of integers", _ints),
    "logit_bias": ("a table of token id = number", _table),
    "regex": ("a string", _text),
    "ebnf": ("a string", _text),
    "response_format": ("a table", _table),
    "tool_choice": ('"auto", "required", "none" or a table', _text_or_table),
    "parallel_tool_calls": ("true or false", _bool),
    "reasoning_effort": ("a string or a finite number", _text_or_number),
}

# Request fields the engine sets itself, and where a run sets them instead.
ENGINE_KEYS: dict[str, str] = {
    "model": "set [generate] model",
    "messages": "they come from the prompts file",
    "tools": "they come from the prompts file",
    "max_tokens": "set [generate] max_tokens (and the `max-tokens` verb while it runs)",
    "max_completion_tokens": "set [generate] max_tokens",
    "stream": "the engine reads whole answers",
    "stream_options": "the engine reads whole answers",
    "rid": "the engine names every request itself (INDEX:ATTEMPT:COPY:ENGINE)",
    "chat_template_kwargs": "use [generate.chat_template_kwargs]",
    "separate_reasoning": "the engine always asks for it",
    "return_spec_tokens_details": "the engine always asks for it",
    "n": "a line holds one answer",
}


def sampling_problem(sampling: dict[str, Any]) -> tuple[str, str] | None:
    """(key, why) for the first key a run may not set, or None."""
    for key, value in sampling.items():
        if key in ENGINE_KEYS:
            return key, f"not a sampling key: {ENGINE_KEYS[key]}"
        known = SAMPLING_KEYS.get(key)
        if known is None:
            return key, ("not a sampling parameter of SGLang's chat API, which would ignore it "
                         f"without a word; one of: {', '.join(SAMPLING_KEYS)}")
        what, check = known
        if not check(value):
            return key, f"must be {what}, got {value!r}"
    return None
