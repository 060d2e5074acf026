"""The `logs` RPC read on from a byte offset (`from`), as the console follows a log: only
what the file gained, a line still being written sent again whole, a rotated, truncated or
rewritten file read again from its tail, a gain too large passed over and counted; and the
run dir's guards hold on this path too (a symlinked log or logs folder is refused, nothing
of its target read). Through the real agent (`serve --stdio`) on one link, as the TUI uses
it."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agents.rpc.protocol import INVALID_PARAMS, REFUSED, RpcError
from console.fleet import Node
from console.logfollow import FollowedLog
from console.transport import AgentLink


@pytest.fixture
async def link(tmp_path: Path) -> AsyncIterator[AgentLink]:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "generate.log").write_bytes(b"one\ntwo\n")
    node = Node(name="local-1", run_dir=str(run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    agent = AgentLink(node)
    await agent.connect()
    try:
        yield agent
    finally:
        await agent.close()


def log_file(link: AgentLink, name: str = "generate") -> Path:
    return Path(link.node.run_dir) / "logs" / f"{name}.log"


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


async def logs(link: AgentLink, **params: Any) -> dict[str, Any]:
    reply: dict[str, Any] = await link.call("logs", params, timeout=60)
    return reply


async def test_read_on_from_an_offset_gets_only_what_the_log_gained(link: AgentLink) -> None:
    path = log_file(link)
    first = await logs(link, name="generate", n=10)
    assert first["lines"] == ["one", "two"] and first["next_from"] == 8
    assert first["inode"] == os.stat(path).st_ino and first["unfinished"] is False
    # Nothing new: nothing sent, the same offset.
    again = await logs(link, name="generate", **{"from": 8}, inode=first["inode"])
    assert again["lines"] == [] and again["next_from"] == 8 and again["restarted"] is None
    # A line being written comes last, unfinished, and not counted in next_from...
    append(path, b"three\nfo")
    got = await logs(link, name="generate", **{"from": 8}, inode=first["inode"])
    assert got["lines"] == ["three", "fo"] and got["unfinished"] is True
    assert got["next_from"] == 14 and got["from"] == 8 and got["skipped_bytes"] == 0
    # ...so the next answer has it whole.
    append(path, b"ur\nfive\n")
    got = await logs(link, name="generate", **{"from": 14}, inode=first["inode"])
    assert got["lines"] == ["four", "five"] and got["unfinished"] is False
    assert got["next_from"] == os.path.getsize(path)


async def test_more_than_asked_for_is_passed_over_and_counted(link: AgentLink) -> None:
    path = log_file(link)
    append(path, b"".join(b"line %d\n" % i for i in range(10)))
    got = await logs(link, name="generate", n=3, **{"from": 8})
    assert got["lines"] == ["line 7", "line 8", "line 9"]
    assert got["skipped_bytes"] == 7 * len(b"line 0\n")
    assert got["next_from"] == os.path.getsize(path)


@pytest.mark.parametrize("change", ["truncated", "rewritten", "rotated"])
async def test_a_log_cut_or_replaced_is_read_again_from_its_tail(link: AgentLink,
                                                                  change: str) -> None:
    path = log_file(link)
    first = await logs(link, name="generate", n=10)
    append(path, b"three\n")
    if change == "truncated":  # shorter than where the console was
        path.write_bytes(b"new\n")
    elif change == "rewritten":  # cut and written past it: no line starts there any more
        path.write_bytes(b"a much longer first line\nsecond\n")
    else:  # logrotate's rename: another file under the name
        fresh = path.with_name("fresh.tmp")
        fresh.write_bytes(b"after rotation\n")
        os.replace(fresh, path)
    got = await logs(link, name="generate", n=10, **{"from": 14}, inode=first["inode"])
    assert got["restarted"] == change, got
    assert got["lines"] == {"truncated": ["new"],
                            "rewritten": ["a much longer first line", "second"],
                            "rotated": ["after rotation"]}[change]
    assert got["next_from"] == os.path.getsize(path) and got["inode"] == os.stat(path).st_ino


async def test_the_console_keeps_each_line_once_through_a_follow(link: AgentLink) -> None:
    """FollowedLog (the TUI's and the headless verb's) over the real answers: no line lost or
    doubled through an unfinished line, a rotation and a stale answer."""
    path = log_file(link)
    log = FollowedLog("generate")
    log.apply(await logs(link, **log.params(100)))
    append(path, b"three\nfo")
    log.apply(await logs(link, **log.params(100)))
    stale = await logs(link, **log.params(100))
    append(path, b"ur\n")
    log.apply(await logs(link, **log.params(100)))
    assert log.apply(stale) is None  # read from an offset no longer kept: left alone
    assert list(log.lines) == ["one", "two", "three", "four"]
    fresh = path.with_name("fresh.tmp")
    fresh.write_bytes(b"rotated one\n")
    os.replace(fresh, path)
    gained = log.apply(await logs(link, **log.params(100)))
    assert gained is not None and gained.note is not None and "rotated" in gained.note
    assert list(log.lines)[-1] == "rotated one" and "rotated" in list(log.lines)[-2]


async def test_a_symlinked_log_is_refused_and_its_target_never_read(link: AgentLink,
                                                                     tmp_path: Path) -> None:
    path = log_file(link)
    first = await logs(link, name="generate", n=10)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"one\ntwo\nOUTSIDE-SECRET\n")
    path.unlink()
    path.symlink_to(secret)  # swapped while the console follows it
    for params in ({"from": first["next_from"], "inode": first["inode"]}, {"from": 0}, {}):
        with pytest.raises(RpcError) as err:
            await logs(link, name="generate", **params)
        assert err.value.code == REFUSED and "symbolic link" in err.value.message
        assert "OUTSIDE-SECRET" not in str(err.value.message)
    # A logs folder that is a link to elsewhere: refused the same way.
    logs_dir = path.parent
    outside = tmp_path / "outside-logs"
    outside.mkdir()
    (outside / "generate.log").write_bytes(b"OUTSIDE-SECRET\n")
    path.unlink()
    logs_dir.rmdir()
    logs_dir.symlink_to(outside)
    with pytest.raises(RpcError) as err:
        await logs(link, name="generate", **{"from": 0})
    assert err.value.code == REFUSED and "OUTSIDE-SECRET" not in err.value.message


@pytest.mark.parametrize("params", [{"from": -1}, {"from": "8"}, {"from": True},
                                    {"from": 0, "before": 8}, {"from": 0, "inode": -2}])
async def test_bad_offsets_are_named(link: AgentLink, params: dict[str, Any]) -> None:
    with pytest.raises(RpcError) as err:
        await logs(link, name="generate", **params)
    assert err.value.code == INVALID_PARAMS
    assert any(word in err.value.message for word in ("from", "inode", "before")), err.value


async def test_a_growing_line_past_the_window_is_followed_without_restarts(
        link: AgentLink) -> None:
    """A tqdm bar writing \\r and never \\n: once its line passes the 4 MiB an answer reads, the
    follow goes on inside it (`mid_line`), never "rewritten" each second; its end brings the
    lines after it, each once."""
    path = log_file(link)
    log = FollowedLog("generate")
    log.apply(await logs(link, **log.params(100)))
    bar = b"\r 12%|##        | 120/1000" * 200_000  # 5.2 MiB, no newline
    append(path, bar)
    notes = []
    for _ in range(4):
        got = await logs(link, **log.params(100))
        assert got["restarted"] is None, got["restarted"]
        gained = log.apply(got)
        assert gained is not None
        notes.append(gained.note)
        assert log.mid_line and log.next_from == os.path.getsize(path)
        append(path, b"\r 13%|##        | 130/1000" * 1000)
    assert not any(n and "rewritten" in n for n in notes)
    # The first answer showed the line's last 4 MiB once (cut); the rest added no line.
    bars = [x for x in log.lines if "120/1000" in x]
    assert len(bars) == 1 and "more characters" in bars[0]
    append(path, b"\ndone\nnext\n")
    got = await logs(link, **log.params(100))
    assert got["restarted"] is None and got["skipped_bytes"] == 0
    log.apply(got)
    assert list(log.lines)[-2:] == ["done", "next"] and not log.mid_line
    assert log.next_from == os.path.getsize(path)
    # A tail whose whole window is inside the line says so too, and is followed from there.
    path.write_bytes(b"start\n" + bar)
    tail_log = FollowedLog("generate")
    got = await logs(link, **tail_log.params(10))
    assert got["mid_line"] is True and got["next_from"] == os.path.getsize(path)
    tail_log.apply(got)
    append(path, b"x\nafter\n")
    got = await logs(link, **tail_log.params(10))
    assert got["restarted"] is None
    tail_log.apply(got)
    assert list(tail_log.lines)[-1] == "after"


async def test_a_mid_line_offset_that_follows_a_newline_restarts(link: AgentLink) -> None:
    first = await logs(link, name="generate", n=10)  # "one\ntwo\n": 4 is a line's start
    got = await logs(link, name="generate", **{"from": 4}, inode=first["inode"],
                     mid_line=True)
    assert got["restarted"] == "rewritten" and got["lines"] == ["one", "two"]
    with pytest.raises(RpcError) as err:
        await logs(link, name="generate", **{"from": 4}, mid_line="yes")
    assert err.value.code == INVALID_PARAMS and "mid_line" in err.value.message
