"""Is a truncated answer a repetition loop or a long answer? Judged from the end of its text
only (the last TAIL_CHARS, at most MAX_TOKENS tokens of it), so the cost is bounded whatever
the answer's length.

A loop is a thinking model repeating itself until max_tokens cuts it: more tokens buy more of
the same, so `retry truncated --long-only` leaves loops alone. The measure: the share of word
6-grams in the tail seen before in the tail (digits folded to 0, so "step 41 ... step 42"
counts as a repeat). Natural prose, code and lists stay well below LOOP_SHARE; a loop of a
sentence or a phrase sits near 1.
"""

from __future__ import annotations

import re

TAIL_CHARS = 3000  # the end of the text judged
N = 6  # n-gram length, in tokens
LOOP_SHARE = 0.5  # repeated n-grams at or above this share of the tail: a loop
MIN_TOKENS = 60  # a shorter tail is judged long: too little to call it a loop
MAX_TOKENS = 800  # of the tail, the last this many tokens (3,000 CJK characters are 3,000)

# A token: one CJK/kana/hangul character (those scripts have no spaces), a word, or one mark.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]|\w+|[^\w\s]")
_DIGITS = re.compile(r"\d+")


def repeat_share(text: str) -> float:
    """The share of the tail's word n-grams that occurred earlier in the tail (0..1)."""
    tail = _DIGITS.sub("0", text[-TAIL_CHARS:])
    tokens = _TOKEN.findall(tail)[-MAX_TOKENS:]
    if len(tokens) < MIN_TOKENS:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    total = len(tokens) - N + 1
    for k in range(total):
        gram = tuple(tokens[k:k + N])
        if gram in seen:
            repeats += 1
        else:
            seen.add(gram)
    return repeats / total


def is_loop(text: str | None) -> bool:
    """A truncated answer whose end repeats itself (see the module docstring)."""
    return bool(text) and repeat_share(text or "") >= LOOP_SHARE


def answer_tail(content: str | None, reasoning: str | None) -> str | None:
    """The text a truncated answer ended in: its content, or its reasoning when the cut came
    before any content (a thinking model looping in its thoughts)."""
    return content if content else reasoning


__all__ = ["LOOP_SHARE", "TAIL_CHARS", "answer_tail", "is_loop", "repeat_share"]
