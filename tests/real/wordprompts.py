"""Prompts for the real server's tiny model: random words, unique text (the radix cache shares
only the chat template), ~3.5 tokens a word with its tokenizer (tests/real/tiny_model.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path


def write_word_prompts(path: Path, n: int, words: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    with open(path, "w") as f:
        for _ in range(n):
            text = " ".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 7)))
                            for _ in range(words))
            f.write(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n")
