"""Rendering batch lines with the chat template, and loss masks from character offsets."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from agents.rundir.schema import BatchLine
from tests.trainer.tinyworld import TOOLS, batch_line
from trainer.render import RenderError, render, tokenize


def line(**kw: Any) -> BatchLine:
    messages = kw.pop("messages", [{"role": "user", "content": "repeat ban dem fit gox"}])
    content = kw.pop("content", "ban dem fit gox")
    return msgspec.convert(batch_line(0, messages, content, **kw), BatchLine)


def supervised_text(tok: Any, ln: BatchLine, supervise: str = "final") -> str:
    sample = tokenize(tok, render(tok, ln, supervise), 4096)  # type: ignore[arg-type]
    return "".join(tok.decode([t]) for t, m in zip(sample.input_ids, sample.loss_mask,
                                                    strict=True) if m)


def test_non_thinking_prompt_is_what_the_server_saw_and_only_the_answer_is_supervised(
        tok: Any) -> None:
    ln = line(kwargs={"enable_thinking": False})
    sample = tokenize(tok, render(tok, ln), 4096)
    prompt = tok.apply_chat_template(ln.messages, tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)
    assert prompt.endswith("<think>\n\n</think>\n\n")
    assert sample.input_ids[: sample.prompt_len] == tok.encode(prompt, add_special_tokens=False)
    assert not any(sample.loss_mask[: sample.prompt_len])
    assert all(sample.loss_mask[sample.prompt_len:])
    # The empty think block was part of the prompt, not generated: no loss on it.
    assert supervised_text(tok, ln) == "ban dem fit gox<|im_end|>\n"
    assert not sample.boundary_merge


def test_thinking_mode_supervises_the_reasoning_inside_think(tok: Any) -> None:
    ln = line(kwargs={}, reasoning="\nfour words, in order\n")
    assert supervised_text(tok, ln) == (
        "<think>\nfour words, in order\n</think>\n\nban dem fit gox<|im_end|>\n")
    # The same answer generated without thinking is trained without it: the thinking mode
    # is the line's own, never the template's default.
    ln_off = line(kwargs={"enable_thinking": False})
    assert "<think>" not in supervised_text(tok, ln_off)


def test_tool_calls_are_supervised_as_the_template_renders_them(tok: Any) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"word": "ban"}'}}
    ln = line(content=None, tool_calls=[call], tools=TOOLS, finish="tool_calls", kwargs={})
    text = supervised_text(tok, ln)
    assert text == ('<think>\n\n</think>\n\n<tool_call>\n{"name": "lookup", "arguments": '
                    '{"word": "ban"}}\n</tool_call><|im_end|>\n')
    full = render(tok, ln).text
    assert "# Tools" in full and '"name": "lookup"' in full


def test_only_the_final_turn_by_default_all_turns_as_an_option(tok: Any) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "repeat ban"},
        {"role": "assistant", "content": "ban ban"},
        {"role": "user", "content": "repeat dem fit gox"},
    ]
    ln = line(messages=messages, content="dem fit gox", kwargs={"enable_thinking": False})
    assert supervised_text(tok, ln) == "dem fit gox<|im_end|>\n"
    both = supervised_text(tok, ln, "all")
    assert both == "ban ban<|im_end|>\ndem fit gox<|im_end|>\n"
    # Same in thinking mode, where the earlier turn renders without its think block.
    ln_think = line(messages=messages, content="dem fit gox", kwargs={})
    assert supervised_text(tok, ln_think, "all") == (
        "ban ban<|im_end|>\n<think>\n\n</think>\n\ndem fit gox<|im_end|>\n")


def test_a_template_whose_answer_does_not_follow_its_prompt_is_refused(tok: Any) -> None:
    broken = copy.deepcopy(tok)
    # The generation prompt opens a think block that the rendered answer does not have.
    broken.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    with pytest.raises(RenderError, match="template mismatch"):
        render(broken, line())


def test_hf_assistant_mask_is_silently_empty_for_this_template_ours_is_not(tok: Any) -> None:
    """reference/dflash.md bug 7: without {% generation %} tags the HF mask is all zeros."""
    ln = line()
    messages = [*ln.messages, {"role": "assistant", "content": ln.content}]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True, enable_thinking=False)
    assert sum(out["assistant_masks"]) == 0
    assert tokenize(tok, render(tok, ln), 4096).supervised > 0


def test_truncation_to_max_length_counts_supervised_tokens_after_it(tok: Any) -> None:
    ln = line(content=" ".join(["ban dem fit gox"] * 10))
    whole = tokenize(tok, render(tok, ln), 4096)
    cut = tokenize(tok, render(tok, ln), whole.prompt_len + 5)
    assert len(cut.input_ids) == whole.prompt_len + 5 and cut.supervised == 5
