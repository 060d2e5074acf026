"""A hostile node on pull's streamed data path (`fleetdeck-agent send-files`, read by
console/artifacts/streamed.py): the agent's answer is the node's to forge. Whatever it sends,
pull writes nothing outside its own folder, never counts a file it did not prove by sha256,
names what went wrong, and keeps the files that were fine.

The fake agent (tests/pull/fakenode.py) sends the scenario's `send` bytes as its stream; the
manifest it serves names real files of RUN_DIR, so a fallback to sftp really fetches them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from agents.artifacts.send import MAGIC
from tests.hostile.conftest import assert_only_changed, tree
from tests.hostile.test_node_answers import HostileNode, no_escape
from tests.hostile.test_node_answers import node as node  # the fixture
from tests.pull.fakenode import entry, page, snapshot

A = b"first file\n" * 100
B = b"second file\n" * 100


def frame(i: int, data: bytes = b"", **head: object) -> bytes:
    return json.dumps({"i": i, "n": len(data), **head}).encode() + b"\n" + data


def serve(node: HostileNode, stream: bytes | dict[str, dict[str, object]]) -> None:
    """Two real files in the manifest; the stream is `stream` whatever pull asks (bytes), or
    the files it names answered as it says and the rest honestly (a dict: fakenode.py)."""
    send = base64.b64encode(stream).decode() if isinstance(stream, bytes) else stream
    node.answer({"status": snapshot(run="fine"),
                 "manifest": page(entry("logs/a.log", node.put("logs/a.log", A)),
                                  entry("logs/b.log", node.put("logs/b.log", B)))},
                send=send)


def forged(data: bytes = b"", **head: object) -> dict[str, object]:
    return {"data": base64.b64encode(data).decode(), "head": head}


def pulled(node: HostileNode, rel: str) -> Path:
    return node.pulls / "gen-1" / "fine" / rel


# The same bytes answer every stream pull opens (it may put each file on its own): each is
# asked for file #0 first, b.log (1,200 bytes) on one.
HOSTILE = [
    pytest.param(MAGIC + frame(0, B + b"extra"), "at most 1200 were asked", id="more-than-asked"),
    pytest.param(MAGIC + frame(1, B), "another file", id="wrong-index"),
    pytest.param(MAGIC + b"{" * (128 * 1024), "longer than the protocol", id="endless-header"),
    pytest.param(MAGIC + b"not json\n", "not JSON", id="garbage-header"),
    pytest.param(MAGIC + frame(0) + b"junk", "had only 0 of 1200", id="short-then-junk"),
    pytest.param(MAGIC + frame(0, B)[:200], "the stream ended", id="cut-mid-file"),
    pytest.param(MAGIC + frame(0, n=-5), "byte count", id="negative-count"),
    pytest.param(MAGIC + json.dumps({"i": 0, "n": 3, "error": "no"}).encode() + b"\n",
                 "refusal that also", id="refusal-with-bytes"),
]


@pytest.mark.parametrize(("stream", "said"), HOSTILE)
def test_a_forged_stream_fails_its_files_by_name_and_writes_nothing_else(
        node: HostileNode, stream: bytes, said: str) -> None:
    serve(node, stream)
    before = tree(node.watched)
    out = node.fleetdeck("pull", "gen-1", "--all")
    assert out.code != 0, out.text
    assert "logs/b.log" in out.text and said in out.text, out.text
    assert not pulled(node, "logs/b.log").exists(), "an unproven file was made final"
    assert_only_changed(before, tree(node.watched), allowed=["pulls/gen-1/fine/"])
    no_escape(out)


def test_wrong_bytes_are_fetched_again_once_then_refused(node: HostileNode) -> None:
    """Bytes of the right length but not the manifest's: the sha256 check refuses them, the
    second round gets the same lie, and the file fails; the other file is fine."""
    serve(node, {"logs/b.log": forged(b"X" * len(B))})
    out = node.fleetdeck("pull", "gen-1", "--all")
    assert out.code != 0
    assert "sha256 differs from the manifest twice" in out.text, out.text
    assert not pulled(node, "logs/b.log").exists()
    assert pulled(node, "logs/a.log").read_bytes() == A


def test_a_refusal_is_shown_escaped_and_the_rest_still_comes(node: HostileNode) -> None:
    serve(node, {"logs/b.log": forged(error="gone \x1b[2J\x07 away")})
    out = node.fleetdeck("pull", "gen-1", "--all")
    assert out.code != 0
    assert "the node refused it: gone" in out.text, out.text
    no_escape(out)
    assert pulled(node, "logs/a.log").read_bytes() == A


def test_an_agent_that_cannot_stream_falls_back_to_sftp(node: HostileNode) -> None:
    """No magic line (an agent from before send-files answers with its usage): the files come
    over OpenSSH's sftp instead, and the pull says so."""
    serve(node, b"usage: fleetdeck-agent [-h] COMMAND\n")
    out = node.fleetdeck("pull", "gen-1", "--all")
    assert out.code == 0, out.text
    assert "pulled over sftp" in out.text and '"data_path": "openssh"' in out.text, out.text
    assert pulled(node, "logs/a.log").read_bytes() == A
    assert pulled(node, "logs/b.log").read_bytes() == B


def test_the_honest_stream_pulls_everything(node: HostileNode) -> None:
    """The judge: the real agent's send-files (no `send` in the scenario) behind the fake
    RPC, and pull takes the stream with no note."""
    node.answer({"status": snapshot(run="fine"),
                 "manifest": page(entry("logs/a.log", node.put("logs/a.log", A)),
                                  entry("logs/b.log", node.put("logs/b.log", B)))})
    out = node.fleetdeck("pull", "gen-1", "--all")
    assert out.code == 0, out.text
    assert '"data_path": "stream", "notes": []' in out.text, out.text
    assert pulled(node, "logs/a.log").read_bytes() == A
    assert pulled(node, "logs/b.log").read_bytes() == B


def test_a_silent_agent_stops_the_pull_at_its_stall_limit_and_the_next_resumes(
        node: HostileNode) -> None:
    """The agent answers part of a file, then stays alive and sends nothing: SSH keepalives
    pass (the connection is fine), so only the pull's own stall limit (the fleet file's
    pull_stall_s) ends it. The pull fails those files by name, keeps what arrived, and an
    honest agent's next pull resumes from it."""
    a = b"a" * len(B)  # both files as long as B: whichever stream asks, 200 bytes come
    with node.fleet.open("a") as fleet:
        # Well past a login and the agent's start on a loaded machine: the clock runs from
        # the fetch, before the first byte.
        fleet.write("pull_stall_s = 10\n")
    manifest = {"status": snapshot(run="fine"),
                "manifest": page(entry("logs/a.log", node.put("logs/a.log", a)),
                                 entry("logs/b.log", node.put("logs/b.log", B)))}
    head = json.dumps({"i": 0, "n": len(B)}).encode() + b"\n"
    node.answer(manifest, send=base64.b64encode(MAGIC + head + b"x" * 200).decode(),
                hang=True)
    out = node.fleetdeck("pull", "gen-1", "--all")
    assert out.code != 0, out.text
    assert "the node sent nothing for 10 s" in out.text, out.text
    for rel in ("logs/a.log", "logs/b.log"):
        assert rel in out.text, out.text
        assert not pulled(node, rel).exists(), "an unproven file was made final"
    parts = sorted(node.pulls.rglob("*.fdpart"))
    assert parts and all(p.stat().st_size == 200 for p in parts), parts
    # The bytes that came were not the file's: the honest pull resumes, then refetches.
    node.answer(manifest)
    again = node.fleetdeck("pull", "gen-1", "--all")
    assert again.code == 0, again.text
    assert '"resumed": {' in again.text and ": 200" in again.text, again.text
    assert pulled(node, "logs/a.log").read_bytes() == a
    assert pulled(node, "logs/b.log").read_bytes() == B
