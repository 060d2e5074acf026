"""A batch line as a training sample: the chat template's text, then tokens and a loss mask.

The text is the target tokenizer's own chat template, rendered with the line's own
`chat_template_kwargs` (so the thinking mode is the one generation used). The generated
turn is everything the template adds after the generation prompt: for Qwen3 in thinking
mode that is `<think>\\n…\\n</think>\\n\\n…<|im_end|>\\n`, reasoning and tool calls placed the
way the template places them. Loss masks come from character offsets of that text, never
from `return_assistant_tokens_mask`, which needs `{% generation %}` tags that stock Qwen3
and Llama templates lack (it then returns all zeros or all ones without a word).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agents.rundir.schema import BatchLine

Supervise = Literal["final", "all"]
# The end of the reasoning in Qwen3's thinking mode: the answer follows it.
THINK_END = "</think>"


class RenderError(ValueError):
    """A line the template cannot render consistently; the message says why."""


@dataclass(frozen=True)
class Rendered:
    text: str
    # Character spans [start, end) that carry loss; the last one is the generated turn.
    spans: list[tuple[int, int]]
    # Where the generated turn's final answer begins (after its `</think>`, if any).
    answer_start: int = -1

    @property
    def generated_start(self) -> int:
        return self.spans[-1][0]


@dataclass(frozen=True)
class Sample:
    input_ids: list[int]
    loss_mask: list[int]
    # Tokens before the generated turn: the prompt the target answered.
    prompt_len: int
    supervised: int
    # A token that straddles the prompt/answer boundary: the training tokenisation of the
    # prompt differs from the one the server used.
    boundary_merge: bool
    # Tokens before `max_length` cut them, and the first token of the final answer (after
    # the generated turn's reasoning): a cut at or before it loses the whole answer.
    length: int = 0
    answer_at: int = 0

    @property
    def cut(self) -> bool:
        return self.length > len(self.input_ids)

    @property
    def lost_answer(self) -> bool:
        return self.cut and self.answer_at >= len(self.input_ids)


def final_turn(line: BatchLine) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": line.content or ""}
    # Only a string is reasoning to the Qwen3 template; None lets it look for <think> in
    # the content, as it would for a server without a reasoning parser.
    if line.reasoning_content is not None:
        turn["reasoning_content"] = line.reasoning_content
    if line.tool_calls:
        turn["tool_calls"] = line.tool_calls
    return turn


def _apply(tokenizer: Any, messages: list[dict[str, Any]], line: BatchLine,
           generation_prompt: bool) -> str:
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=line.tools, tokenize=False,
            add_generation_prompt=generation_prompt, **line.chat_template_kwargs)
    except Exception as exc:  # jinja raises many types (TemplateError, TypeError, ...)
        raise RenderError(f"chat template failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(text, str):
        raise RenderError("chat template did not return text")
    return text


def _shared(a: str, b: str) -> int:
    """The length of the common prefix of two strings."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def _earlier_turn(tokenizer: Any, line: BatchLine, j: int, full: str) -> tuple[int, int]:
    """The span of an earlier assistant turn inside the full text.

    Earlier turns are rendered differently from a last turn (Qwen3 drops their reasoning),
    so the span is found in place: after the text of the messages before it and the part of
    the generation prompt that the full text repeats (the role header), up to the end of
    turn marker and the whitespace after it.
    """
    before = _apply(tokenizer, line.messages[:j], line, False) if j else ""
    if not full.startswith(before):
        raise RenderError(f"messages[{j}]: template renders the conversation inconsistently")
    header = _apply(tokenizer, line.messages[:j], line, True)[len(before):]
    start = len(before) + _shared(header, full[len(before):])
    eos = tokenizer.eos_token
    end = full.find(eos, start) if eos else -1
    if end < 0:
        raise RenderError(f"messages[{j}]: no end-of-turn {eos!r} after the assistant turn")
    end += len(eos)
    while end < len(full) and full[end] in " \t\r\n":
        end += 1
    return start, end


def render(tokenizer: Any, line: BatchLine, supervise: Supervise = "final") -> Rendered:
    """Render a line; the generated turn is supervised, earlier assistant turns with "all"."""
    messages = [*line.messages, final_turn(line)]
    prompt = _apply(tokenizer, line.messages, line, True)
    full = _apply(tokenizer, messages, line, False)
    if not full.startswith(prompt):
        # The answer would be trained after a context the server never sent: refuse.
        at = _shared(prompt, full)
        raise RenderError(
            "template mismatch: the rendered conversation does not begin with the generation "
            f"prompt (they differ at character {at}: {prompt[at:at + 20]!r} vs "
            f"{full[at:at + 20]!r})")
    spans = [(len(prompt), len(full))]
    if supervise == "all":
        earlier = [_earlier_turn(tokenizer, line, j, full)
                   for j, m in enumerate(line.messages) if m.get("role") == "assistant"]
        spans = earlier + spans
    think_end = full.rfind(THINK_END, len(prompt))
    answer = think_end + len(THINK_END) if think_end >= 0 else len(prompt)
    return Rendered(full, spans, answer)


def tokenize(tokenizer: Any, rendered: Rendered, max_length: int) -> Sample:
    """Tokens of the whole text; a token carries loss when its first character is in a span."""
    enc = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    offsets: list[tuple[int, int]] = [tuple(o) for o in enc["offset_mapping"]]
    mask = [0] * len(ids)
    spans = rendered.spans
    gen_start = rendered.generated_start
    prompt_len = len(ids)
    answer_at = len(ids)
    answer_start = rendered.answer_start if rendered.answer_start >= 0 else gen_start
    boundary_merge = False
    s = 0
    for t, (a, b) in enumerate(offsets):
        while s < len(spans) and spans[s][1] <= a:
            s += 1
        if s < len(spans) and spans[s][0] <= a < spans[s][1]:
            mask[t] = 1
        if a < gen_start < b:
            boundary_merge = True
        if prompt_len == len(ids) and a >= gen_start:
            prompt_len = t
        if answer_at == len(ids) and a >= answer_start:
            answer_at = t
    length = len(ids)
    ids, mask = ids[:max_length], mask[:max_length]
    return Sample(ids, mask, min(prompt_len, len(ids)), sum(mask), boundary_merge, length,
                  answer_at)
