"""FollowedLog, the console's side of a followed log: an answer that is not the protocol's is
refused by name and nothing of it kept; memory stays bounded however much a node sends; and
each line gets the level a person would give it (SGLang's, uvicorn's, Python logging's and
tracebacks)."""

from __future__ import annotations

from typing import Any

import pytest

from console.logfollow import (
    ERROR,
    INFO,
    MARK,
    MAX_LINE_CHARS,
    WARNING,
    BadLogAnswer,
    FollowedLog,
    line_level,
)


def answer(lines: list[str], next_from: int, **more: Any) -> dict[str, Any]:
    return {"path": "/r/logs/generate.log", "lines": lines, "next_from": next_from,
            "inode": 7, "unfinished": False, **more}


@pytest.mark.parametrize("bad", [
    None, [], "lines", {"lines": "a\nb", "next_from": 3},
    {"lines": ["a", 5], "next_from": 3},
    {"lines": ["a"], "next_from": -1}, {"lines": ["a"], "next_from": True},
    {"lines": ["a"], "next_from": "3"}, {"lines": ["a"], "next_from": 3, "inode": -4},
    {"lines": ["a"], "next_from": 3, "restarted": "gone"},
])
def test_a_malformed_answer_is_refused_and_nothing_kept(bad: Any) -> None:
    log = FollowedLog("generate")
    with pytest.raises(BadLogAnswer) as err:
        log.apply(bad)
    assert str(err.value)
    assert not log.lines and log.next_from is None


def test_an_old_agent_s_tail_is_kept_not_followed_and_named_with_the_fix_once() -> None:
    """An agent from before following answers a tail only: kept (again in place, never
    doubled), not followed (no `from` asked), the fix said once."""
    log = FollowedLog("generate")
    old = {"path": "x", "size": 4, "lines": ["a", "b"], "next_before": None}
    gained = log.apply(old)
    assert gained is not None and gained.lines == ["a", "b"]
    assert gained.note is not None and "fleetdeck bootstrap NODE" in gained.note
    assert log.old_agent and log.next_from is None and "from" not in log.params(10)
    assert list(log.lines)[:2] == ["a", "b"] and log.levels[-1] == MARK
    again = log.apply({**old, "lines": ["a", "b", "c"]})
    assert again is not None and again.note is None
    assert list(log.lines)[:3] == ["a", "b", "c"] and len(log.lines) == 4
    # A follower that had an offset and then gets none: not the protocol.
    following = FollowedLog("generate")
    following.apply(answer(["a"], 2))
    with pytest.raises(BadLogAnswer, match="next_from"):
        following.apply(old)


def test_memory_is_bounded_in_lines_and_in_line_length() -> None:
    log = FollowedLog("generate", max_lines=100)
    log.apply(answer([f"line {i}" for i in range(150)], 1000))
    assert len(log.lines) == 100 and log.lines[0] == "line 50" and log.dropped == 50
    log.apply(answer(["x" * 5_000_000], 6_001_000, **{"from": 1000}))
    kept = log.lines[-1]
    assert len(kept) < MAX_LINE_CHARS + 100 and kept.endswith("(4,996,000 more characters)")
    assert len(log.lines) == 100 and log.end == 151


def test_an_unfinished_line_is_kept_once_and_a_stale_answer_left_alone() -> None:
    log = FollowedLog("generate")
    log.apply(answer(["a", "b", "par"], 4, unfinished=True))
    stale = answer(["x"], 9, **{"from": 4})
    gained = log.apply(answer(["partial done", "c"], 20, **{"from": 4}))
    assert gained is not None and gained.lines == ["partial done", "c"]
    assert list(log.lines) == ["a", "b", "partial done", "c"] and log.rewrites == 1
    assert log.apply(stale) is None and list(log.lines)[-1] == "c"
    gained = log.apply(answer(["d"], 30, **{"from": 20}, restarted="truncated"))
    assert gained is not None and gained.note is not None and "truncated" in gained.note
    assert log.levels[-2] == MARK and log.lines[-1] == "d"


@pytest.mark.parametrize(("line", "level"), [
    ("2026-12-06 10:00:00,123 INFO agents.engine.run: batch 4 closed", INFO),
    ("2026-12-06 10:00:00,123 WARNING agents.engine: slow", WARNING),
    ("2026-12-06 10:00:00,123 trainer.cli ERROR step failed", ERROR),
    ("WARNING:root:deprecated", WARNING),
    ('INFO:     127.0.0.1:5123 - "POST /generate HTTP/1.1" 200 OK', INFO),
    ("ERROR:    Exception in ASGI application", ERROR),
    ("[2026-12-06 10:00:00 TP0] Decode batch. #running-req: 4, #token: 812", INFO),
    ("[2026-12-06 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call "
     "last):", ERROR),
    ("/opt/sglang/launch_server.py:71: UserWarning: use sglang serve", WARNING),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", ERROR),
    ("the count of ERROR lines is 0", INFO),
])
def test_levels_as_a_person_reads_them(line: str, level: int) -> None:
    assert line_level(line, INFO) == level


def test_a_traceback_stays_with_its_error_and_a_new_record_ends_it() -> None:
    lines = ["2026-12-06 10:00:00,1 ERROR engine: server 0 died",
             "Traceback (most recent call last):", '  File "x.py", line 3, in f',
             "    raise ValueError('x')", "ValueError: x", "",
             "[2026-12-06 10:00:01] Decode batch. #running-req: 1"]
    level, got = INFO, []
    for line in lines:
        level = line_level(line, level)
        got.append(level)
    assert got == [ERROR] * 6 + [INFO]
