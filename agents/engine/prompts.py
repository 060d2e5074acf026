"""The prompt set: streamed line by line (never loaded whole), normalised to OpenAI messages.

The index of a prompt is its 0-based line number. ShareGPT (`conversations: [{from, value}]`)
and OpenAI (`messages: [{role, content}]`) shapes are accepted, system prompts and tools too.
A UTF-8 byte order mark before the first line is passed over. One line that cannot be read
(not JSON, nested too deeply, over `[generate] max_prompt_bytes`, any other failure) is that
index's `bad_input`, with the reason; it never stops the run.
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


BOM = b"\xef\xbb\xbf"
DEFAULT_MAX_PROMPT_BYTES = 16 << 20
# Deeper JSON than this is refused: far beyond any real prompt (tool schemas nest ~20), and far
# enough under Python's recursion limit that every later encode of the prompt succeeds.
MAX_NESTING = 200


class BadPrompt(ValueError):
    """A prompt line that cannot be sent; the message says why."""


@dataclass(frozen=True, slots=True)
class TooLong:
    """A line over the size limit, passed over unread: its size in bytes (newline not
    counted)."""

    size: int
    limit: int


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
        except RecursionError:
            raise BadPrompt("tools is a string of JSON nested too deeply to read") from None
        if nesting(raw) > MAX_NESTING:
            raise BadPrompt(f"tools is a string of JSON nested over {MAX_NESTING} levels")
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


def parse_prompt(index: int, raw: bytes | TooLong) -> Prompt:
    """Parse one line into a Prompt; raise BadPrompt saying what is wrong, whatever it is."""
    if isinstance(raw, TooLong):
        raise BadPrompt(f"{raw.size:,} bytes, over [generate] max_prompt_bytes "
                        f"({raw.limit:,}); not read")
    try:
        return _parse(index, raw)
    except BadPrompt:
        raise
    except RecursionError:
        raise BadPrompt("JSON nested too deeply to read") from None
    except Exception as exc:  # one bad line must never stop the run: say what it was
        raise BadPrompt(f"cannot be read: {type(exc).__name__}: {exc}") from None


def _parse(index: int, raw: bytes) -> Prompt:
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadPrompt(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadPrompt("not a JSON object")
    # Cheap for nearly every line (two byte counts); only a line with many brackets is walked.
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING:
        depth = nesting(obj)
        if depth > MAX_NESTING:
            raise BadPrompt(f"JSON nested {depth} levels deep, over {MAX_NESTING}")
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


def nesting(obj: Any) -> int:
    """How deeply lists and objects nest in a decoded JSON value (a scalar is 0); iterative,
    so any depth is measured without recursion."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(obj, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        todo.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


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


def has_prompts(path: Path) -> bool:
    """Whether the file holds anything but whitespace (and a byte order mark); reads only
    until the first such byte, so a real prompts file costs one read."""
    with open(path, "rb", buffering=0) as f:
        first = True
        while chunk := f.read(1 << 16):
            if first and chunk.startswith(BOM):
                chunk = chunk[len(BOM):]
            first = False
            if chunk.strip():
                return True
    return False


def stream(path: Path, want: Callable[[int], bool], start: int = 0,
           max_bytes: int = DEFAULT_MAX_PROMPT_BYTES) -> Iterator[tuple[int, bytes | TooLong]]:
    """Yield (index, raw line) for the lines whose index `want` accepts, from `start` on. A
    line over `max_bytes` (newline not counted) is never held whole: it is read through in
    pieces and yielded as TooLong."""
    cap = max_bytes + 1
    with open(path, "rb", buffering=1 << 20) as f:
        readline = f.readline
        index = 0
        line = readline(cap)
        if line.startswith(BOM) and (len(line) < cap or line.endswith(b"\n")):
            line = line[len(BOM):]
        while line:
            if len(line) == cap and not line.endswith(b"\n"):
                size = len(line)
                while piece := readline(1 << 20):
                    size += len(piece)
                    if piece.endswith(b"\n"):
                        size -= 1
                        break
                if index >= start and want(index):
                    yield index, TooLong(size, max_bytes)
            elif index >= start and want(index):
                yield index, line
            index += 1
            line = readline(cap)
