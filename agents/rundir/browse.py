"""Reading files of a run directory for people: log tails, recent completions, history.

Every path is confined to RUN_DIR: `..`, absolute paths and symlinks leading out are refused,
each component checked with lstat (a symlink is never followed, even one pointing inside).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.batchnames import batch_files

MAX_TAIL_BYTES = 4 * 1024 * 1024


class OutsideRunDir(ValueError):
    pass


def confined(run_dir: Path, relative: str) -> Path:
    """RUN_DIR/relative, or OutsideRunDir naming why not."""
    if not relative or "\x00" in relative:
        raise OutsideRunDir("empty path")
    rel = Path(relative)
    if rel.is_absolute():
        raise OutsideRunDir(f"{relative}: absolute paths are refused; give a path in the run dir")
    if any(part == ".." for part in rel.parts):
        raise OutsideRunDir(f"{relative}: '..' is refused")
    path = run_dir
    for part in rel.parts:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise OutsideRunDir(f"{relative}: no such file in {run_dir}") from None
        if stat.S_ISLNK(st.st_mode):
            raise OutsideRunDir(f"{relative}: {path.name} is a symbolic link; refused")
    return path


def log_path(run_dir: Path, name: str) -> Path:
    """A log by short name (`generate`, `sglang_gpu3`, `supervisor`) or a relative path."""
    if "/" not in name and not name.endswith(".log"):
        name = f"logs/{name}.log"
    elif "/" not in name:
        name = f"logs/{name}"
    return confined(run_dir, name)


def tail(path: Path, lines: int = 100, before: int | None = None) -> dict[str, Any]:
    """The last `lines` lines ending before byte offset `before` (pagination backwards)."""
    size = path.stat().st_size
    end = size if before is None else max(0, min(before, size))
    start = max(0, end - MAX_TAIL_BYTES)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    base = start
    if start > 0:  # drop the partial first line
        cut = data.find(b"\n") + 1
        base, data = start + cut, data[cut:]
    chunks = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        chunks.pop()
    chosen = chunks[-lines:] if lines > 0 else []
    first = base + sum(len(c) + 1 for c in chunks[: len(chunks) - len(chosen)])
    return {"path": str(path), "size": size,
            "lines": [c.decode(errors="replace") for c in chosen],
            "next_before": first if first > 0 else None}


class _Sample(msgspec.Struct):
    index: int
    finish_reason: str
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[Any] | None = None
    attempt: int = 1
    server: int | None = None
    latency_s: float | None = None


_sample_decoder = msgspec.json.Decoder(_Sample)


def sample_view(line: _Sample, head: int = 400) -> dict[str, Any]:
    return {
        "index": line.index, "finish_reason": line.finish_reason,
        "completion_tokens": line.usage.get("completion_tokens"),
        "reasoning_tokens": line.usage.get("reasoning_tokens"),
        "reasoning_head": (line.reasoning_content or "")[:head],
        "content_head": (line.content or "")[:head],
        "tool_calls": len(line.tool_calls or []), "attempt": line.attempt,
        "server": line.server, "latency_s": line.latency_s,
    }


def recent_samples(run_dir: Path, n: int = 10) -> list[dict[str, Any]]:
    """The last n completions on disk: the open batch first, then the newest closed ones."""
    comp = run_dir / "completions"
    if not comp.is_dir():
        return []
    files = batch_files(comp)[::-1]
    out: list[dict[str, Any]] = []
    for path in files:
        if len(out) >= n:
            break
        try:
            got = tail(path, n - len(out))["lines"]
        except OSError:
            continue
        for raw in reversed(got):
            try:
                out.append(sample_view(_sample_decoder.decode(raw)))
            except msgspec.DecodeError:
                continue  # a torn line at the end of the open batch
    return out[:n]


def history(run_dir: Path, since: float = 0.0, limit: int = 1000) -> dict[str, Any]:
    """Status samples from history.jsonl after `since`, oldest first, `limit` at a time."""
    path = run_dir / "history.jsonl"
    items: list[Any] = []
    more = False
    if path.exists():
        with open(path, "rb") as f:
            for raw in f:
                try:
                    obj = msgspec.json.decode(raw)
                except msgspec.DecodeError:
                    continue
                if obj.get("updated_at", 0) <= since:
                    continue
                if len(items) >= limit:
                    more = True
                    break
                items.append(obj)
    return {"items": items, "more": more}
