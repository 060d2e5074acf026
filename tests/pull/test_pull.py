"""Pull over SFTP from a real sshd: resumable, checksummed; the decommission gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from console.decommission import checklist, pull_node
from console.fleet import Node
from console.pull import PULL_CIPHERS, Progress
from console.transport import AgentLink
from tests.servers.s3 import S3Server
from tests.servers.sshd import SshServer

AGENT = f"{sys.executable} -m agents.cli"


def agent_with_keys(s3: S3Server) -> str:
    """The node holds the S3 credentials (verify runs there): here, in the agent's env."""
    return "env " + " ".join(f"{k}={v}" for k, v in s3.env().items()) + " " + AGENT


def make_node(sshd: SshServer, run_dir: Path, s3: S3Server) -> Node:
    return Node(name="gen-1", host="127.0.0.1", port=sshd.port, user=sshd.user,
                identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                run_dir=str(run_dir), agent=agent_with_keys(s3), connect_timeout_s=5)


async def _link(node: Node) -> AgentLink:
    link = AgentLink(node, ciphers=PULL_CIPHERS)
    await link.connect()
    return link


async def test_pull_resumes_after_a_dropped_connection(sshd: SshServer, finished_run: Path,
                                                      tmp_path: Path, s3: S3Server) -> None:
    node = make_node(sshd, finished_run, s3)
    pulls = tmp_path / "pulls"
    big = finished_run / "logs" / "big.log"
    link = await _link(node)
    assert link.conn is not None
    cipher = link.conn.get_extra_info("send_cipher")
    assert cipher == "aes128-gcm@openssh.com"

    def cut(p: Progress) -> None:
        # Drop the SSH connection once the big file is well under way.
        if p.bytes_done > big.stat().st_size // 2 and link.conn is not None:
            link.conn.abort()

    first = await pull_node(link, node, pulls, on_progress=cut)
    await link.close()
    dest = pulls / "gen-1" / "test-run"
    assert "logs/big.log" in first.failed, "the drop should have hit the big file"
    part = dest / "logs" / "big.log.fdpart"
    offset = part.stat().st_size
    assert 0 < offset < big.stat().st_size
    done_before = set(first.copied)

    link = await _link(node)
    second = await pull_node(link, node, pulls)
    await link.close()
    assert second.ok, second.failed
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


async def test_decommission_gate(sshd: SshServer, finished_run: Path, tmp_path: Path,
                                 s3: S3Server) -> None:
    node = make_node(sshd, finished_run, s3)
    pulls = tmp_path / "pulls"
    link = await _link(node)
    try:
        before = await checklist(link, node, pulls)
        assert not before.ok
        assert [i.ok for i in before.items] == [True, True, False], before.items[1]
        report = await pull_node(link, node, pulls)
        assert report.ok
        assert (await checklist(link, node, pulls)).ok
        dest = pulls / "gen-1" / "test-run"
        altered = dest / "failures.jsonl"
        altered.write_text(altered.read_text() + "{}\n")
        gate = await checklist(link, node, pulls)
        assert not gate.ok
        assert gate.items[2].missing == ["failures.jsonl (differs)"]
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


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd"])
def test_manifest_paths_leaving_the_run_dir_are_refused(bad: str) -> None:
    from console.pull import PullError, safe_rel

    with pytest.raises(PullError):
        safe_rel(bad)
