"""The prompt set: streamed line by line (never loaded whole), normalised to OpenAI messages.

The index of a prompt is its 0-based line number. ShareGPT (`conversations: [{from, value}]`)
and OpenAI (`messages: [{role, content}]`) shapes are accepted, system prompts and tools too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}


class BadPrompt(ValueError):
    """A prompt line that cannot be sent; the message says why."""


@dataclass(frozen=True, slots=True)
class Prompt:
    index: int
    id: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None or raw == "" or raw == []:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadPrompt(f"tools is a string that is not JSON: {exc}") from None
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise BadPrompt("tools must be a list of objects")
    # Accept bare function definitions as well as OpenAI's {"type": "function", ...}.
    return [t if "type" in t else {"type": "function", "function": t} for t in raw]


def _openai_messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise BadPrompt("messages must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadPrompt(f"messages[{i}] has no role")
        if "content" not in m and "tool_calls" not in m:
            raise BadPrompt(f"messages[{i}] has no content")
        out.append(m)
    return out


def _sharegpt_messages(raw: Any, system: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise BadPrompt("conversations must be a non-empty list")
    out: list[dict[str, Any]] = []
    if isinstance(system, str) and system:
        out.append({"role": "system", "content": system})
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise BadPrompt(f"conversations[{i}] is not an object")
        who = turn.get("from")
        role = SHAREGPT_ROLES.get(who) if isinstance(who, str) else None
        if role is None:
            raise BadPrompt(f"conversations[{i}] has unknown from={who!r}")
        value = turn.get("value")
        if not isinstance(value, str):
            raise BadPrompt(f"conversations[{i}] has no string value")
        out.append({"role": role, "content": value})
    return out


def parse_prompt(index: int, raw: bytes) -> Prompt:
    """Parse one line into a Prompt; raise BadPrompt saying what is wrong."""
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadPrompt(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadPrompt("not a JSON object")
    if "messages" in obj:
        messages = _openai_messages(obj["messages"])
    elif "conversations" in obj:
        messages = _sharegpt_messages(obj["conversations"], obj.get("system"))
    else:
        raise BadPrompt("neither messages (OpenAI) nor conversations (ShareGPT)")
    # A trailing assistant turn is the old answer: drop it and generate anew.
    while messages and messages[-1].get("role") == "assistant":
        messages = messages[:-1]
    if not any(m.get("role") in ("user", "tool") for m in messages):
        raise BadPrompt("no user turn to answer")
    pid = obj.get("id")
    return Prompt(
        index=index,
        id=str(pid) if pid is not None else None,
        messages=messages,
        tools=_tools(obj.get("tools")),
    )


def scan(path: Path) -> tuple[str, int, int]:
    """sha256, line count and size of the prompts file, streamed."""
    h = hashlib.sha256()
    lines = 0
    size = 0
    last = b"\n"
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            lines += chunk.count(b"\n")
            size += len(chunk)
            last = chunk[-1:]
    if size and last != b"\n":
        lines += 1
    return h.hexdigest(), lines, size


def stream(path: Path, want: Callable[[int], bool], start: int = 0) -> Iterator[tuple[int, bytes]]:
    """Yield (index, raw line) for the lines whose index `want` accepts, from `start` on."""
    with open(path, "rb", buffering=1 << 20) as f:
        for index, line in enumerate(f):
            if index < start or not want(index):
                continue
            yield index, line
