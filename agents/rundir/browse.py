"""Reading files of a run directory for people: log tails, recent completions, history.

Every path is confined to RUN_DIR: `..`, absolute paths and symlinks leading out are refused,
each component checked with lstat (a symlink is never followed, even one pointing inside).
"""

from __future__ import annotations

import os
import re
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


LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


def known_logs(run_dir: Path) -> list[str]:
    """The names `logs` answers for: the regular `*.log` files directly in RUN_DIR/logs."""
    try:
        entries = list(os.scandir(run_dir / "logs"))
    except OSError:
        return []
    names = []
    for entry in entries:
        if entry.name.endswith(".log") and LOG_NAME.fullmatch(entry.name) and \
                entry.is_file(follow_symlinks=False):
            names.append(entry.name[:-4])
    return sorted(names)


def _known_text(run_dir: Path) -> str:
    names = known_logs(run_dir)
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return f"known logs: {shown}" if names else "the run has no logs yet"


def log_path(run_dir: Path, name: str) -> Path:
    """RUN_DIR/logs/NAME.log for a log *name* (`generate`, `sglang_gpu3`, `supervisor`, or
    `generate.log`): never a path. The file must be a regular file, not a symlink."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise OutsideRunDir(f"{name!r} is not a log name")
    if name.startswith("/"):
        raise OutsideRunDir(f"{name}: absolute paths are refused; give a log name "
                            f"({_known_text(run_dir)})")
    if ".." in name.split("/"):
        raise OutsideRunDir(f"{name}: '..' is refused; give a log name ({_known_text(run_dir)})")
    if "/" in name or not LOG_NAME.fullmatch(name):
        raise OutsideRunDir(f"{name!r} is not a log name: a path is refused "
                            f"({_known_text(run_dir)})")
    stem = name[:-4] if name.endswith(".log") else name
    path = run_dir / "logs" / f"{stem}.log"
    try:
        logs_st = os.lstat(run_dir / "logs")
        st = os.lstat(path)
    except FileNotFoundError:
        raise OutsideRunDir(f"{name}: no such log in {run_dir / 'logs'} "
                            f"({_known_text(run_dir)})") from None
    if stat.S_ISLNK(logs_st.st_mode) or stat.S_ISLNK(st.st_mode):
        raise OutsideRunDir(f"{name}: {path} is a symbolic link; refused")
    if not stat.S_ISREG(st.st_mode):
        raise OutsideRunDir(f"{name}: {path} is not a regular file; refused")
    return path


class NotRegular(OSError):
    """A file that is not a plain file (a FIFO, a device, a socket): never read."""


def open_regular(path: Path) -> int:
    """A descriptor on a regular file, opened without following a final symlink and without
    blocking (a FIFO would block an open for reading until a writer comes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path}: not a regular file; refused")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int = 64 * 2**20) -> bytes:
    """A small run-directory file read whole, as `open_regular` opens it; a file over `limit`
    bytes is refused (OSError), never loaded."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path}: over {limit} bytes; refused")
    return data


def _lines(data: bytes, base: int, whole_first: bool, lines: int) -> dict[str, Any]:
    """The last `lines` lines of `data`, the file's bytes from offset `base`. `whole_first`:
    `data` starts at a line's start (else its first, partial line is dropped). The bytes
    after the last newline are a line still being written: shown last, marked `unfinished`,
    and left out of `next_from` (the offset a later `from` read starts at: always a line's
    start), so that a follower gets that line again, whole, once it ends. `data` with no
    line start at all is the middle of one very long line: shown as it is, `mid_line`, and
    `next_from` its end (inside that line: a follower says `mid_line` back). `head`: the
    bytes dropped to reach the first line start (the rest of a line begun earlier)."""
    found_start = whole_first
    head = 0
    if not whole_first:
        cut = data.find(b"\n") + 1
        if cut:
            base, data, found_start, head = base + cut, data[cut:], True, cut
    chunks = data.split(b"\n")
    finished = data.endswith(b"\n") or not data
    if finished:
        chunks.pop()
    chosen = chunks[-lines:] if lines > 0 else []
    first = base + sum(len(c) + 1 for c in chunks[: len(chunks) - len(chosen)])
    end = base + len(data)
    unfinished = not finished and found_start
    return {"lines": [c.decode(errors="replace") for c in chosen], "first": first,
            "next_from": end - len(chunks[-1]) if unfinished else end,
            "unfinished": unfinished and bool(chosen), "mid_line": not found_start,
            "head": head}


def tail(path: Path, lines: int = 100, before: int | None = None) -> dict[str, Any]:
    """The last `lines` lines ending before byte offset `before` (pagination backwards).
    Only a regular file is read (see open_regular); at most MAX_TAIL_BYTES of it. Without
    `before`, the answer also says where a follower goes on from (`next_from`, `inode`)."""
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
        return _tail_fd(fd, st, path, lines, before)
    finally:
        os.close(fd)


def _tail_fd(fd: int, st: os.stat_result, path: Path, lines: int,
             before: int | None) -> dict[str, Any]:
    size = st.st_size
    end = size if before is None else max(0, min(before, size))
    start = max(0, end - MAX_TAIL_BYTES)
    got = _lines(os.pread(fd, end - start, start), start, start == 0, lines)
    first = got["first"]
    out = {"path": str(path), "size": size, "lines": got["lines"],
           "next_before": first if first > 0 else None}
    if before is None:
        out.update(inode=st.st_ino, next_from=got["next_from"], unfinished=got["unfinished"],
                   mid_line=got["mid_line"])
    return out


def since(path: Path, offset: int, inode: int | None, lines: int,
          mid_line: bool = False) -> dict[str, Any]:
    """What a log gained after byte `offset` (the `next_from` of an earlier answer): at most
    its last `lines` complete lines and MAX_TAIL_BYTES, `skipped_bytes` counting what was
    passed over to stay in those bounds. A file that is not the one read before (another
    `inode`: rotated), is shorter than `offset` (truncated) or has no line start at `offset`
    (truncated and written past it) is read again from its tail, `restarted` saying why.
    `mid_line`: `offset` is inside an over-long line (an answer said so): it must not follow a
    newline, and the rest of that line (shown cut already) is passed over, not counted."""
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
        size = st.st_size
        restarted = None
        if inode is not None and st.st_ino != inode:
            restarted = "rotated"
        elif offset > size:
            restarted = "truncated"
        elif offset > 0 and (os.pread(fd, 1, offset - 1) == b"\n") is mid_line:
            restarted = "rewritten"
        if restarted is not None:
            out = _tail_fd(fd, st, path, lines, None)
            out.update({"from": offset, "restarted": restarted, "skipped_bytes": 0})
            return out
        start = max(offset, size - MAX_TAIL_BYTES)
        going_on = mid_line and start == offset  # the over-long line's rest comes first
        got = _lines(os.pread(fd, size - start, start), start,
                     start == offset and not mid_line, lines)
    finally:
        os.close(fd)
    if going_on and got["mid_line"]:  # still that line: nothing new to show
        got.update(lines=[], first=offset, next_from=size)
    skipped = got["first"] - offset - (got["head"] if going_on else 0)
    return {"path": str(path), "size": size, "inode": st.st_ino, "from": offset,
            "lines": got["lines"], "next_from": got["next_from"],
            "unfinished": got["unfinished"], "mid_line": got["mid_line"],
            "skipped_bytes": skipped, "restarted": None}


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
    """The last n completions on disk: the open batch first, then the newest closed ones.
    Symlinks (the completions folder or a batch) and non-regular files are passed over."""
    comp = run_dir / "completions"
    try:
        if not stat.S_ISDIR(os.lstat(comp).st_mode):
            return []
    except OSError:
        return []
    files = batch_files(comp)[::-1]
    out: list[dict[str, Any]] = []
    for path in files:
        if len(out) >= n:
            break
        try:
            got = tail(path, n - len(out))["lines"]
        except OSError:
            continue  # a symlink, a FIFO, unreadable: never read
        for raw in reversed(got):
            try:
                out.append(sample_view(_sample_decoder.decode(raw)))
            except (msgspec.DecodeError, RecursionError):
                continue  # a torn line at the end of the open batch, or a hostile one
    return out[:n]


def history(run_dir: Path, since: float = 0.0, limit: int = 1000,
            offset: int | None = None) -> dict[str, Any]:
    """Status samples from history.jsonl after `since`, oldest first, `limit` at a time.
    `offset` (an earlier answer's `next_offset`: a line's start) reads on from there, so that
    no page decodes the file from its start again and no sample sharing the previous page's
    last time is lost (paging by `since` alone drops them). A line that is not a JSON object
    with a numeric `updated_at` is skipped and counted (`bad_lines`, in the lines this call
    read); a history.jsonl that is a symlink or not a regular file is not read (`refused`
    says why). ValueError: an offset past the end or not at a line's start."""
    path = run_dir / "history.jsonl"
    items: list[Any] = []
    more = False
    bad = 0
    start = offset or 0
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return {"items": items, "more": more, "bad_lines": 0, "next_offset": start}
    except OSError as exc:
        reason = str(exc) if isinstance(exc, NotRegular) else \
            f"{path}: {'a symbolic link' if os.path.islink(path) else exc.strerror}; refused"
        return {"items": items, "more": more, "bad_lines": 0, "refused": reason}
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if start > size or (start > 0 and os.pread(fd, 1, start - 1) != b"\n"):
            raise ValueError(f"{path}: offset {start} is not a line's start (the file has "
                             f"{size} bytes); page from an earlier answer's next_offset")
        f.seek(start)
        pos = start
        for raw in f:
            if len(items) >= limit:
                more = True
                break
            # A last line with no newline yet is read, but not passed: paged again when whole.
            pos += len(raw) if raw.endswith(b"\n") else 0
            if not raw.strip():
                continue
            try:
                obj = msgspec.json.decode(raw)
            except (msgspec.DecodeError, RecursionError):
                bad += 1
                continue
            at = obj.get("updated_at") if isinstance(obj, dict) else None
            if not isinstance(at, (int, float)) or isinstance(at, bool):
                bad += 1
                continue
            if at > since:
                items.append(obj)
    return {"items": items, "more": more, "bad_lines": bad, "next_offset": pos}
