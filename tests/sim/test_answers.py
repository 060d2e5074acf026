"""Answers that behave like a model's, over HTTP: a prompt's answer is its own, and a higher
max_tokens gets the same answer further (what `retry truncated` relies on)."""

from __future__ import annotations

import httpx

from agents.sim.config import SimConfig
from agents.sim.output import OutputPlanner
from tests.simserver import SimHandle


def generate(sim: SimHandle, text: str, max_new: int) -> dict:
    resp = httpx.post(f"{sim.url}/generate", timeout=60,
                      json={"text": text, "sampling_params": {"max_new_tokens": max_new}})
    resp.raise_for_status()
    return resp.json()


def prompts_by_length(low: int, high: int, n: int) -> list[tuple[str, int]]:
    """Prompts whose natural answer (at the simulator's default seed) is in [low, high)."""
    planner = OutputPlanner(SimConfig())
    found = []
    for i in range(10_000):
        text = f"Tell me about item {i}."
        natural = planner.natural_length(text)
        if low <= natural < high:
            found.append((text, natural))
            if len(found) == n:
                return found
    raise AssertionError(f"no prompt with a natural length in [{low}, {high})")


def test_same_prompt_same_natural_length_at_4096_and_8192(sim: SimHandle) -> None:
    for text, natural in prompts_by_length(4200, 8000, 2):
        cut = generate(sim, text, 4096)
        assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 4096}
        assert cut["meta_info"]["completion_tokens"] == 4096
        whole = generate(sim, text, 8192)
        assert whole["meta_info"]["finish_reason"]["type"] == "stop"
        assert whole["meta_info"]["completion_tokens"] == natural
        assert whole["text"].startswith(cut["text"])  # the same answer, further
        assert generate(sim, text, 8192)["text"] == whole["text"]
    for text, natural in prompts_by_length(50, 4000, 2):
        short = generate(sim, text, 4096)
        assert short["meta_info"]["finish_reason"]["type"] == "stop"
        assert short["meta_info"]["completion_tokens"] == natural
        assert generate(sim, text, 8192)["text"] == short["text"]
