"""Pull over SFTP from a real sshd, by OpenSSH's sftp and by the asyncssh fallback: resumable,
checksummed; the decommission gate."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from console.artifacts.decommission import checklist, pull_node
from console.artifacts.pull import PULL_CIPHERS, puller_for
from console.artifacts.sources import choose_data_path, open_source
from console.fleet import Node
from console.transport import AgentLink, ssh_connect
from tests.servers.s3 import S3Server
from tests.servers.sshd import SshServer

AGENT = f"{sys.executable} -m agents.cli"


def agent_with_keys(s3: S3Server) -> str:
    """The node holds the S3 credentials (verify runs there): here, in the agent's env."""
    return "env " + " ".join(f"{k}={v}" for k, v in s3.env().items()) + " " + AGENT


def make_node(sshd: SshServer, run_dir: Path, s3: S3Server) -> Node:
    return Node(name="gen-1", host="127.0.0.1", port=sshd.port, user=sshd.user,
                identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                run_dir=str(run_dir), agent=agent_with_keys(s3), connect_timeout_s=30)


async def _link(node: Node) -> AgentLink:
    link = AgentLink(node, ciphers=PULL_CIPHERS)
    await link.connect()
    return link


def _session_children(sshd_pid: int) -> list[int]:
    """The per-connection processes of the sshd: killing them drops every SSH session."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == sshd_pid:
                kids.append(int(entry))
    return kids


async def _drop_connections_at(part: Path, size: int, sshd: SshServer) -> None:
    """Kill the node's SSH sessions once `part` holds more than `size` bytes: the data path
    itself loses its connection mid-file, whichever client it is."""
    while not (part.exists() and part.stat().st_size > size):
        await asyncio.sleep(0.002)
    for pid in _session_children(sshd.proc.pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


# Names a batch line must quote (and one it cannot carry, which takes the per-file path).
ODD_NAMES = ['we ird*[1]?.log', 'q"uo\\te\'s #.log', "-dash.log", "new\nline.log"]


@pytest.mark.parametrize("data_path", ["stream", "openssh", "asyncssh"])
async def test_pull_resumes_after_a_dropped_connection(sshd: SshServer, finished_run: Path,
                                                      tmp_path: Path, s3: S3Server,
                                                      data_path: str) -> None:
    if data_path == "openssh" and shutil.which("sftp") is None:
        pytest.skip("OpenSSH's sftp client is not installed")
    node = make_node(sshd, finished_run, s3)
    pulls = tmp_path / "pulls"
    big = finished_run / "logs" / "big.log"
    for name in ODD_NAMES:
        (finished_run / "logs" / name).write_text(f"odd file {name!r}\n")
    link = await _link(node)
    assert link.conn is not None
    cipher = link.conn.get_extra_info("send_cipher")
    assert cipher == "aes128-gcm@openssh.com"

    dest = pulls / "gen-1" / "test-run"
    part = dest / "logs" / "big.log.fdpart"
    # Drop the SSH connections once the big file is under way. On a loaded machine the
    # watcher can be starved past the file's end (the copy is faster than its wake-ups):
    # then nothing was cut, and the pull starts over from nothing, to cut earlier.
    for share in (4, 16, 64):
        cut = asyncio.create_task(_drop_connections_at(part, big.stat().st_size // share,
                                                       sshd))
        try:
            first = await pull_node(link, node, pulls, data_path=data_path)
        finally:
            cut.cancel()
            await asyncio.gather(cut, return_exceptions=True)
            await link.close()
        if "logs/big.log" in first.failed:
            break
        shutil.rmtree(pulls)
        link = await _link(node)
    assert first.data_path == data_path
    assert "logs/big.log" in first.failed, "the drop should have hit the big file"
    offset = part.stat().st_size
    assert 0 < offset < big.stat().st_size
    done_before = set(first.copied)

    link = await _link(node)
    second = await pull_node(link, node, pulls, data_path=data_path)
    await link.close()
    assert second.ok, second.failed
    assert second.data_path == data_path and not second.notes
    assert second.resumed["logs/big.log"] == offset
    assert done_before <= set(second.skipped), "finished files were copied again"
    assert not set(second.copied) & done_before
    # Only what was missing crossed the wire: the rest of the big file and the unfinished.
    unfinished = sum((finished_run / rel).stat().st_size for rel in second.copied)
    assert second.bytes_transferred == unfinished - sum(second.resumed.values())
    # Every file of the pull set is here, byte for byte; batches in S3 were left there.
    manifest = json.loads((dest / ".fleetdeck" / "manifest.json").read_text())
    for e in manifest:
        local = dest / e["path"]
        if e["kind"] == "batch" and e["in_s3"]:
            assert not local.exists()
        elif e["refused"] is None and e["path"] != ".manifest_cache.json":
            assert local.read_bytes()[: e["size"]] == (finished_run / e["path"]).read_bytes()[
                : e["size"]], e["path"]
    assert (dest / "completions" / ".done_indices").exists()
    assert len(list((dest / "logs").glob("shard_*.log"))) == 300
    for name in ODD_NAMES:
        assert (dest / "logs" / name).read_text() == f"odd file {name!r}\n"
    assert not list(dest.rglob("*.fdpart")), "parts left behind"


async def test_decommission_gate(sshd: SshServer, finished_run: Path, tmp_path: Path,
                                 s3: S3Server) -> None:
    node = make_node(sshd, finished_run, s3)
    pulls = tmp_path / "pulls"
    link = await _link(node)
    try:
        before = await checklist(link, node, pulls)
        assert not before.ok
        assert [i.name for i in before.items] == ["run finished", "verify (S3 and counts)",
                                                  "nothing refused", "artifacts pulled"]
        assert [i.ok for i in before.items] == [True, True, True, False], before.items
        report = await pull_node(link, node, pulls)
        assert report.ok
        assert (await checklist(link, node, pulls)).ok
        dest = pulls / "gen-1" / "test-run"
        altered = dest / "failures.jsonl"
        altered.write_text(altered.read_text() + "{}\n")
        gate = await checklist(link, node, pulls)
        assert not gate.ok
        assert gate.items[3].missing == ["failures.jsonl (differs)"]
        # An S3 object gone: verify fails and names the batch.
        client = s3.client()
        client.delete_object(Bucket=s3.bucket, Key="runs/test/completions_000003.jsonl")
        gate = await checklist(link, node, pulls)
        assert not gate.items[1].ok
        assert "completions_000003.jsonl" in " ".join(gate.items[1].missing)
    finally:
        await link.close()


def test_headless_pull_and_check_exit_codes(sshd: SshServer, finished_run: Path,
                                            tmp_path: Path, s3: S3Server) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("\n".join([
        "[console]", f'pull_dir = "{tmp_path / "pulls"}"', "", "[[nodes]]", 'name = "gen-1"',
        'host = "127.0.0.1"', f"port = {sshd.port}", f'user = "{sshd.user}"',
        f'identity_file = "{sshd.client_key}"', f'known_hosts = "{sshd.known_hosts}"',
        f'run_dir = "{finished_run}"', f'agent = "{agent_with_keys(s3)}"', ""]))

    def fd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet),
                               *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **s3.env()})

    r = fd("decommission-check", "gen-1", "--json")
    assert r.returncode == 1
    assert not json.loads(r.stdout)["ok"]
    r = fd("pull", "gen-1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["copied"] > 300
    r = fd("decommission-check", "gen-1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SAFE to give the node back" in r.stdout
    # A node that cannot be reached: pull connects its link itself (after the stream's ssh
    # logins began) and still says so with exit 3, leaving no ssh behind.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    fleet.write_text(fleet.read_text().replace(f"port = {sshd.port}", f"port = {port}"))
    r = fd("pull", "gen-1")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == "", r.stderr
    assert str(port) in r.stderr or "refused" in r.stderr.lower(), r.stderr
    assert not [p for p in os.listdir("/proc") if p.isdigit() and str(port).encode() in
                _cmdline(int(p))], "an ssh to the closed port was left running"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd"])
def test_manifest_paths_leaving_the_run_dir_are_refused(bad: str) -> None:
    from console.artifacts.pullset import safe_rel
    from console.artifacts.sources import PullError

    with pytest.raises(PullError):
        safe_rel(bad)


def test_training_pull_set_takes_latest_and_best_checkpoints_only() -> None:
    from agents.rundir.schema import ManifestEntry
    from console.artifacts.pullset import pull_set

    def entry(path: str, kind: str) -> ManifestEntry:
        return ManifestEntry(path=path, kind=kind, size=1, mtime=0, mtime_ns=0,  # type: ignore[arg-type]
                             sha256="0" * 64)

    entries = [entry("progress.json", "state"), entry("logs/train.log", "log"),
               entry("checkpoints/best.json", "checkpoint")]
    for step in (100, 200, 300):
        entries.append(entry(f"checkpoints/epoch_0_step_{step}/drafter.safetensors",
                             "checkpoint"))
    train = {"last_checkpoint": "checkpoints/epoch_0_step_300",
             "best_checkpoint": "/abs/run/checkpoints/epoch_0_step_100/"}
    chosen = {e.path for e in pull_set(entries, "train", False, train)}
    assert chosen == {"progress.json", "logs/train.log", "checkpoints/best.json",
                      "checkpoints/epoch_0_step_300/drafter.safetensors",
                      "checkpoints/epoch_0_step_100/drafter.safetensors"}
    assert len(pull_set(entries, "train", True, train)) == len(entries)


def test_data_path_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from console.artifacts.sources import DATA_PATH_ENV, PullError

    monkeypatch.setenv(DATA_PATH_ENV, "asyncssh")
    assert choose_data_path() == "asyncssh"
    assert choose_data_path("openssh") == "openssh"  # the argument wins
    assert choose_data_path("stream") == "stream"
    monkeypatch.delenv(DATA_PATH_ENV)
    assert choose_data_path() == ("stream" if shutil.which("ssh") else
                                  "openssh" if shutil.which("sftp") else "asyncssh")
    monkeypatch.setenv(DATA_PATH_ENV, "rsync")
    with pytest.raises(PullError):
        choose_data_path()


def test_sftp_batches_quote_names_and_balance_bytes() -> None:
    from console.artifacts.opensftp import Job, batch_line, plan, quote

    assert quote('a "b" \\c*?[d]') == '"a \\"b\\" \\\\c*?[d]"'
    assert batch_line("-x") == b'-reget "./-x" "./-x.fdpart"\n'
    assert batch_line("a\nb") is None and batch_line("x" * 1100) is None
    jobs = [Job(f"big{i}", 100 * 2**20, b"") for i in range(10)]
    jobs += [Job(f"small{i}", 4096, b"") for i in range(1000)]
    batches = plan(jobs, 4)
    loads = [sum(j.size for j in b) for b in batches]
    assert len(batches) == 4 and max(loads) <= 3 * 100 * 2**20 + 2**20
    assert sorted(j.rel for b in batches for j in b) == sorted(j.rel for j in jobs)
    assert plan(jobs[:2], 4) == [[jobs[0]], [jobs[1]]]


def test_stream_batches_balance_bytes_and_lead_with_the_small_files() -> None:
    from console.artifacts import opensftp, streamed
    from console.artifacts.opensftp import Job

    jobs = [Job(f"big{i}", (100 - i) * 2**20, b"") for i in range(10)]
    jobs += [Job(f"small{i}", 1024 + i, b"") for i in range(1000)]
    batches = streamed.plan(jobs, 2)
    assert [set(b) for b in batches] == [set(b) for b in opensftp.plan(jobs, 2)]
    for batch in batches:
        assert [j.size for j in batch] == sorted(j.size for j in batch)


def _procs(which: Callable[[int, int], bool]) -> list[str]:
    """Live processes (not zombies) for which which(ppid, pgrp) holds, as 'pid comm'."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            state, ppid, pgrp = stat[stat.rfind(")") + 2:].split()[:3]
            if state != "Z" and which(int(ppid), int(pgrp)):
                found.append(f"{entry} {stat[stat.index('(') + 1:stat.rfind(')')]}")
    return found


def _alive(groups: set[int]) -> list[str]:
    return _procs(lambda ppid, pgrp: pgrp in groups)


async def test_openssh_path_trims_refetches_falls_back_and_cancels(sshd: SshServer,
                                                                   tmp_path: Path) -> None:
    if shutil.which("sftp") is None:
        pytest.skip("OpenSSH's sftp client is not installed")
    from agents.rundir.schema import ManifestEntry

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    files = {"grown.log": b"a" * 5000 + b"b" * 300, "wrong": b"x" * 100, "empty": b"",
             "big.bin": os.urandom(128 * 2**20)}
    for name, data in files.items():
        (run_dir / name).write_bytes(data)

    def entry(path: str, data: bytes, sha: str | None = None) -> ManifestEntry:
        return ManifestEntry(path=path, kind="log", size=len(data), mtime=0, mtime_ns=0,
                             sha256=sha or hashlib.sha256(data).hexdigest())

    entries = [entry("grown.log", b"a" * 5000),  # a log that grew after it was hashed
               entry("wrong", files["wrong"], "0" * 64), entry("empty", b""),
               entry("gone", b"was here"), entry("big.bin", files["big.bin"])]
    node = Node(name="gen-1", host="127.0.0.1", port=sshd.port, user=sshd.user,
                identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                run_dir=str(run_dir), connect_timeout_s=30)
    dest = tmp_path / "pulls"
    conn = await ssh_connect(node, PULL_CIPHERS)
    try:
        # Cancelled mid-file: the sftp processes (and their ssh) die, the part stays.
        source = await open_source(node, conn, "openssh")
        part = dest / "big.bin.fdpart"
        for _ in range(3):
            groups: set[int] = set()
            task = asyncio.create_task(puller_for(source, dest).run(entries))
            # Until sftp has been seen and the part holds bytes: on a loaded box the part can
            # have bytes before this loop first looks for sftp (ci4 saw no group at all).
            deadline = time.monotonic() + 120
            while not (groups and part.exists() and part.stat().st_size > 0) and \
                    not task.done():
                assert time.monotonic() < deadline, "sftp never seen mid-file"
                # sftp runs in a process group of its own (pgid = its pid), ssh under it.
                groups |= {int(p.split()[0]) for p in
                           _procs(lambda ppid, pgrp: ppid == os.getpid())
                           if p.split()[1] == "sftp"}
                await asyncio.sleep(0.002)
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError("the pull failed before it was cancelled") \
                    from task.exception()
            # Stopped, then looked at: a look before the stop could be followed by the rest
            # of the copy (128 MiB go in well under a second), so a copy seen whole once
            # stopped is cancelled and started again from nothing.
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGSTOP)
            mid_file = not task.done() and part.exists() and \
                0 < part.stat().st_size < len(files["big.bin"])
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if mid_file:
                break
            shutil.rmtree(dest, ignore_errors=True)
        else:
            raise AssertionError("three pulls copied the whole file before they were stopped")
        assert groups
        for _ in range(250):
            if not _alive(groups):
                break
            await asyncio.sleep(0.02)
        assert not _alive(groups), _alive(groups)
        offset = part.stat().st_size
        assert 0 < offset < len(files["big.bin"])

        report = await puller_for(source, dest).run(entries)
        await source.close()
        assert report.data_path == "openssh" and not report.notes
        assert report.resumed == {"big.bin": offset}
        assert "big.bin" in report.copied  # the small ones may have made it before the cancel
        assert set(report.copied) | set(report.skipped) == {"big.bin", "empty", "grown.log"}
        assert (dest / "grown.log").read_bytes() == b"a" * 5000
        assert (dest / "empty").read_bytes() == b""
        assert (dest / "big.bin").read_bytes() == files["big.bin"]
        assert report.refetched == ["wrong"]
        assert report.failed["wrong"] == "sha256 differs from the manifest twice"
        assert "not found" in report.failed["gone"]
        assert set(report.failed) == {"wrong", "gone"}

        # An sftp that cannot reach the node while the agent link can: asyncssh takes over.
        fake = tmp_path / "sftp"
        fake.write_text("#!/bin/sh\necho 'Host key verification failed.' >&2\nexit 255\n")
        fake.chmod(0o755)
        source = await open_source(node, conn, "openssh")
        assert hasattr(source, "fetcher")
        source.fetcher.sftp = str(fake)
        again = dest / "again"
        report = await puller_for(source, again).run(entries[:1] + entries[2:3] + entries[4:])
        await source.close()
        assert report.ok, report.failed
        assert report.data_path == "asyncssh"
        assert "Host key verification failed" in report.notes[0]
        assert (again / "big.bin").read_bytes() == files["big.bin"]
    finally:
        conn.close()


async def test_a_refused_file_fails_the_gate(sshd: SshServer, finished_run: Path,
                                             tmp_path: Path, s3: S3Server) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not part of the run\n")
    (finished_run / "logs" / "escape.log").symlink_to(outside)
    node = make_node(sshd, finished_run, s3)
    link = await _link(node)
    try:
        report = await pull_node(link, node, tmp_path / "pulls")
        assert report.ok and report.refused == ["logs/escape.log"]
        gate = await checklist(link, node, tmp_path / "pulls")
    finally:
        await link.close()
    refused = gate.items[2]
    assert not gate.ok and not refused.ok and refused.missing == ["logs/escape.log (symlink)"]
    assert not (tmp_path / "pulls" / "gen-1" / "test-run" / "logs" / "escape.log").exists()


async def test_prestarted_streams_are_the_ones_used_and_unused_ones_end(sshd: SshServer,
                                                                       tmp_path: Path) -> None:
    """The stream's ssh processes start before the manifest is read (their logins overlap
    it): the fetch takes exactly those, starting none of its own, and the ones a pull leaves
    unused (a single small file needs one stream) are ended when the source closes."""
    from console.artifacts import streamed
    from console.artifacts.opensftp import Job

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "a.log").write_bytes(b"hello")
    node = Node(name="gen-1", host="127.0.0.1", port=sshd.port, user=sshd.user,
                identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                run_dir=str(run_dir), agent=AGENT, connect_timeout_s=30)
    ssh = shutil.which("ssh")
    assert ssh is not None
    fetcher = streamed.StreamFetcher(ssh, node, procs=2)
    spawned: list[subprocess.Popen[bytes]] = []
    real_spawn = fetcher._spawn

    def counted() -> tuple[subprocess.Popen[bytes], object] | str:
        got = real_spawn()
        assert not isinstance(got, str), got
        spawned.append(got[0])
        return got

    fetcher._spawn = counted  # type: ignore[assignment,method-assign]
    fetcher.prestart()
    assert len(spawned) == 2 and all(p.poll() is None for p in spawned)
    dest = tmp_path / "dest"
    dest.mkdir()
    said: dict[str, str | None] = {}
    result = await fetcher.fetch([Job("a.log", 5, b"")], dest, dest / ".state",
                                 lambda job, why: said.__setitem__(job.rel, why))
    assert result.connected and said == {"a.log": None}
    assert (dest / "a.log.fdpart").read_bytes() == b"hello"
    assert len(spawned) == 2  # the fetch took a prestarted one
    await fetcher.close()
    for p in spawned:
        assert p.wait(timeout=30) is not None  # every one ended, the unused one too
