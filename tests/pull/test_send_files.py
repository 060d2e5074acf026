"""`fleetdeck-agent send-files`, the node's half of pull's stream, run as the console runs it
(a process reading requests on stdin): it serves only what the manifest would list, from
where it was asked, and says per file why it refused one."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.artifacts.send import MAGIC


def send(run_dir: Path, requests: list[dict[str, object]] | bytes
         ) -> tuple[int, list[tuple[dict[str, object], bytes]], str]:
    """(exit status, [(header, bytes)], stderr) of one send-files run."""
    raw = requests if isinstance(requests, bytes) else b"".join(
        json.dumps(r).encode() + b"\n" for r in requests)
    r = subprocess.run([sys.executable, "-m", "agents.cli", "send-files", str(run_dir)],
                       input=raw, capture_output=True, timeout=60)
    out = r.stdout
    assert out.startswith(MAGIC), out[:200]
    pos, frames = len(MAGIC), []
    while pos < len(out):
        end = out.index(b"\n", pos)
        head = json.loads(out[pos:end])
        n = head["n"]
        frames.append((head, out[end + 1:end + 1 + n]))
        pos = end + 1 + n
    return r.returncode, frames, r.stderr.decode()


def test_serves_ranges_and_refuses_what_is_no_artifact(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    data = os.urandom(10_000)
    (run / "logs" / "a.log").write_bytes(data)
    (run / "secrets.json").write_text('{"s3": {"secret_access_key": "hunter2"}}')
    (run / "supervisor.pid").write_text("1")
    (run / "logs" / ".tmp-x").write_text("half written")
    (tmp_path / "outside").write_text("not the run's")
    (run / "link").symlink_to(tmp_path / "outside")
    (run / "dirlink").symlink_to(tmp_path)
    os.mkfifo(run / "logs" / "fifo")
    odd = os.fsdecode(b"logs/odd\xff.log")
    (run / odd).write_bytes(b"odd name")
    code, frames, err = send(run, [
        {"path": "logs/a.log", "offset": 0, "length": 10_000},
        {"path": "logs/a.log", "offset": 9_000, "length": 5_000},  # past the end: cut
        {"path": "logs/a.log", "offset": 20_000, "length": 5},  # beyond it: nothing
        {"path": "secrets.json", "offset": 0, "length": 100},
        {"path": "supervisor.pid", "offset": 0, "length": 1},
        {"path": "logs/.tmp-x", "offset": 0, "length": 12},
        {"path": "link", "offset": 0, "length": 13},
        {"path": "dirlink/outside", "offset": 0, "length": 13},
        {"path": "../outside", "offset": 0, "length": 13},
        {"path": str(tmp_path / "outside"), "offset": 0, "length": 13},
        {"path": "logs/fifo", "offset": 0, "length": 1},
        {"raw": base64.b64encode(b"logs/odd\xff.log").decode(), "offset": 4, "length": 4},
    ])
    assert code == 0, err
    assert [h["i"] for h, _ in frames] == list(range(12))
    assert frames[0] == ({"i": 0, "n": 10_000}, data)
    assert frames[1] == ({"i": 1, "n": 1_000}, data[9_000:])
    assert frames[2] == ({"i": 2, "n": 0}, b"")
    for head, body in frames[3:11]:
        assert head["n"] == 0 and body == b"" and head.get("error"), head
    assert "not an artifact" in str(frames[3][0]["error"])
    assert "symbolic link" in str(frames[7][0]["error"])
    assert "'..' is refused" in str(frames[8][0]["error"])
    assert "absolute" in str(frames[9][0]["error"])
    assert frames[11] == ({"i": 11, "n": 4}, b"name")
    everything = b"".join(body for _, body in frames) + json.dumps(
        [h for h, _ in frames]).encode()
    assert b"hunter2" not in everything and b"not the run's" not in everything


def test_a_bad_request_ends_the_stream_after_what_came_before(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "progress.json").write_text("{}")
    good = json.dumps({"path": "progress.json", "offset": 0, "length": 2}).encode() + b"\n"
    for bad, said in [(b'{"path": "progress.json", "offset": -1, "length": 2}\n', ">= 0"),
                      (b'{"path": "progress.json", "offset": true, "length": 2}\n', ">= 0"),
                      (b"[1, 2]\n", "not an object"),
                      (b"{" * 20_000 + b"\n", "longer than")]:
        code, frames, err = send(run, good + bad + good)
        assert code == 2 and said in err, (bad[:40], err)
        assert frames == [({"i": 0, "n": 2}, b"{}")]


def test_a_fifo_where_a_file_was_is_refused_not_waited_on(tmp_path: Path) -> None:
    """The manifest's hash and send-files open what the walk found: a FIFO swapped in since
    would have held the open forever (no writer); it is refused as not a regular file."""
    from agents.artifacts.manifest import hash_file

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "swapped.log")
    with pytest.raises(OSError, match="not a regular file"):
        hash_file(run, "swapped.log")


def test_small_files_gathered_and_big_ones_sent_come_whole_and_in_order(tmp_path: Path
                                                                        ) -> None:
    """Small files go gathered with their headers into large writes, big ones by sendfile:
    the frames are the same either way, around the boundary and mixed."""
    from agents.artifacts.send import SMALL

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    sizes = [0, 1, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL, 5] + [4000] * 300
    blobs = []
    for i, n in enumerate(sizes):
        blobs.append(os.urandom(n))
        (run / "logs" / f"f{i}.log").write_bytes(blobs[-1])
    code, frames, err = send(run, [{"path": f"logs/f{i}.log", "offset": 0, "length": n}
                                   for i, n in enumerate(sizes)])
    assert code == 0, err
    assert frames == [({"i": i, "n": n}, blobs[i]) for i, n in enumerate(sizes)]


def test_each_answer_comes_before_the_next_request_is_made(tmp_path: Path) -> None:
    """What is gathered goes out before send-files waits for more requests: a console that
    asks one file at a time gets each answer while it has not asked the next."""
    import select

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "a.log").write_bytes(b"first")
    (run / "logs" / "b.log").write_bytes(b"second")
    proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "send-files", str(run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    got = b""

    def read_until(want: bytes) -> None:
        nonlocal got
        while not got.endswith(want):
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, f"no answer while the next request waits; have {got!r}"
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"the stream ended; have {got!r}"
            got += chunk

    try:
        for name, body in [("a", b"first"), ("b", b"second")]:
            proc.stdin.write(json.dumps({"path": f"logs/{name}.log", "offset": 0,
                                         "length": len(body)}).encode() + b"\n")
            read_until(body)  # answered, with stdin still open
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert got == (MAGIC + b'{"i": 0, "n": 5}\nfirst' + b'{"i": 1, "n": 6}\nsecond')


def test_send_files_starts_without_the_other_verbs(tmp_path: Path) -> None:
    """A pull waits for one send-files start per stream: the verb's module is imported alone
    (not the engine's, the supervisor's or the RPC server's), as Python's own import log
    shows, and it still answers."""
    (tmp_path / "a.log").write_bytes(b"hello")
    line = json.dumps({"path": "a.log", "offset": 0, "length": 5}).encode() + b"\n"
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "agents.cli", "send-files",
                        str(tmp_path)], input=line, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(MAGIC) and r.stdout.endswith(b"hello"), r.stdout
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.decode().splitlines()
                if ln.startswith("import time:")}
    assert "agents.artifacts.send" in imported
    for heavy in ("agents.cli.control", "agents.cli.inspect", "agents.cli.generate",
                  "agents.cli.serve", "agents.rpc.serve", "asyncio"):
        assert heavy not in imported, f"send-files imported {heavy}"
