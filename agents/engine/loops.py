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

import itertools
import re

TAIL_CHARS = 3000  # the end of the text judged
N = 6  # n-gram length, in tokens
LOOP_SHARE = 0.5  # repeated n-grams at or above this share of the tail: a loop
MIN_TOKENS = 60  # a shorter tail is judged long: too little to call it a loop
MAX_TOKENS = 800  # of the tail, the last this many tokens (3,000 CJK characters are 3,000)

# A token: one CJK/kana/hangul character (those scripts have no spaces), a word, or one mark.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]|\w+|[^\w\s]")
_DIGITS = re.compile(r"\d+")
# The same for ASCII text (most answers), without the regex engine (the judge ran for every
# truncated answer at ~265 us, more than the rest of the engine's work for it; now ~80 us):
# on bytes, digit runs folded (0s are digits only, so a run of 0s folds to one), each mark
# present spaced apart, and a split at whitespace (bytes' isspace: re's \s for ASCII text
# but \x1c-\x1f, which str's \s has: text with those takes the regex).
_ZEROS = bytes.maketrans(b"0123456789", b"0000000000")
_NOT_MARKS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_ \t\n\r\x0b\x0c"


def tokens_of(tail: str) -> list[str] | list[bytes]:
    """The tail's tokens, its digit runs folded to 0 (bytes for ASCII text)."""
    if tail.isascii() and not any(c in tail for c in "\x1c\x1d\x1e\x1f"):
        folded = tail.encode("ascii").translate(_ZEROS)
        while b"00" in folded:
            folded = folded.replace(b"00", b"0")
        for mark in set(folded.translate(None, _NOT_MARKS)):
            folded = folded.replace(b"%c" % mark, b" %c " % mark)
        return folded.split()
    return _TOKEN.findall(_DIGITS.sub("0", tail))


def _tail_tokens(text: str) -> list[str] | list[bytes]:
    return tokens_of(text[-TAIL_CHARS:])[-MAX_TOKENS:]


def repeat_share(text: str) -> float:
    """The share of the tail's word n-grams that occurred earlier in the tail (0..1): each
    n-gram's occurrences after its first, over all of them."""
    tokens = _tail_tokens(text)
    return 0.0 if len(tokens) < MIN_TOKENS else _share(tokens)


def _share(tokens: list[str] | list[bytes]) -> float:
    grams = list(zip(*(tokens[i:] for i in range(N)), strict=False))
    return (len(grams) - len(set(grams))) / len(grams)


def is_loop(text: str | None) -> bool:
    """A truncated answer whose end repeats itself (see the module docstring)."""
    if not text:
        return False
    tokens = _tail_tokens(text)
    if len(tokens) < MIN_TOKENS:
        return False
    # Each n-gram starts with a word pair: at least as many distinct n-grams as distinct
    # pairs at their starts. Over the share a loop leaves distinct, it is no loop, decided
    # without the n-grams (most answers, at half their cost).
    total = len(tokens) - N + 1
    if len(set(itertools.pairwise(tokens[:total + 1]))) > total * (1 - LOOP_SHARE):
        return False
    return _share(tokens) >= LOOP_SHARE


def answer_tail(content: str | None, reasoning: str | None) -> str | None:
    """The text a truncated answer ended in: its content, or its reasoning when the cut came
    before any content (a thinking model looping in its thoughts)."""
    return content if content else reasoning


__all__ = ["LOOP_SHARE", "TAIL_CHARS", "answer_tail", "is_loop", "repeat_share", "tokens_of"]
