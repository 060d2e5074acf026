"""The dataset's one declared Arrow schema, and a batch line made into one row of it.

Fixed whatever the lines hold: `messages` is list<struct<role, content>> (a message's other
keys, and non-text content, kept as JSON in `extra`), tool calls and tools are JSON strings,
usage a struct. A field over MAX_FIELD_BYTES is refused by name (file:line), never written.
"""

from __future__ import annotations

import json
from typing import Any

from agents.rundir.schema import BatchLine

# A text field this large is not an answer (a 32k-token answer is ~150 KB); Arrow's string
# column holds 2 GiB per chunk, so one hostile line must not reach it.
MAX_FIELD_BYTES = 64 << 20


class RowError(ValueError):
    """A line that cannot be a row: says the file:line and the field."""


def schema() -> Any:
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string()),
                         ("extra", pa.string())])
    usage = pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
                       ("reasoning_tokens", pa.int64())])
    return pa.schema([
        ("index", pa.int64()),
        ("id", pa.string()),
        ("messages", pa.list_(message)),
        ("reasoning", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.string()),
        ("tools", pa.string()),
        ("finish_reason", pa.string()),
        ("usage", usage),
        ("max_tokens", pa.int64()),
        ("attempt", pa.int64()),
        ("hedged", pa.bool_()),
        ("model", pa.string()),
        ("server", pa.int64()),
    ])


# The card's `dataset_info.features`, the same schema in the Hub's words.
FEATURES: list[dict[str, Any]] = [
    {"name": "index", "dtype": "int64"},
    {"name": "id", "dtype": "string"},
    {"name": "messages", "list": [{"name": "role", "dtype": "string"},
                                  {"name": "content", "dtype": "string"},
                                  {"name": "extra", "dtype": "string"}]},
    {"name": "reasoning", "dtype": "string"},
    {"name": "content", "dtype": "string"},
    {"name": "tool_calls", "dtype": "string"},
    {"name": "tools", "dtype": "string"},
    {"name": "finish_reason", "dtype": "string"},
    {"name": "usage", "struct": [{"name": "prompt_tokens", "dtype": "int64"},
                                 {"name": "completion_tokens", "dtype": "int64"},
                                 {"name": "reasoning_tokens", "dtype": "int64"}]},
    {"name": "max_tokens", "dtype": "int64"},
    {"name": "attempt", "dtype": "int64"},
    {"name": "hedged", "dtype": "bool"},
    {"name": "model", "dtype": "string"},
    {"name": "server", "dtype": "int64"},
]


def _text(value: str | None, where: str, field: str) -> str | None:
    if value is not None and len(value) > MAX_FIELD_BYTES // 4 \
            and len(value.encode()) > MAX_FIELD_BYTES:
        raise RowError(f"{where}: {field} is {len(value.encode()):,} bytes, over the "
                       f"{MAX_FIELD_BYTES:,} a dataset field may hold; not exported")
    return value


def _json(value: Any, where: str, field: str) -> str | None:
    return None if value is None else _text(json.dumps(value, ensure_ascii=False), where, field)


def _message(m: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise RowError(f"{where}: a message is {type(m).__name__}, not an object")
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str):
        raise RowError(f"{where}: a message's role is {role!r}, not a string")
    rest = {k: v for k, v in m.items() if k not in ("role", "content")}
    if content is not None and not isinstance(content, str):
        rest["content"] = content  # a list of parts: kept whole, as JSON
        content = None
    return {"role": role, "content": _text(content, where, "messages.content"),
            "extra": _json(rest, where, "messages.extra") if rest else None}


def row(line: BatchLine, where: str) -> dict[str, Any]:
    """One batch line as a row of `schema()`; RowError naming `where` (file:line)."""
    u = line.usage
    return {
        "index": line.index, "id": line.id,
        "messages": [_message(m, where) for m in line.messages],
        "reasoning": _text(line.reasoning_content, where, "reasoning"),
        "content": _text(line.content, where, "content"),
        "tool_calls": _json(line.tool_calls, where, "tool_calls"),
        "tools": _json(line.tools, where, "tools"),
        "finish_reason": line.finish_reason,
        "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                  "reasoning_tokens": u.reasoning_tokens},
        "max_tokens": line.max_tokens, "attempt": line.attempt, "hedged": line.hedged,
        "model": line.model, "server": line.server,
    }
