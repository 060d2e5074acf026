"""Host keys as OpenSSH checks them (issue 11, item 3), over the real sshd, with OpenSSH's own
`ssh-keygen -F` and `ssh` as the judges of the known_hosts file.

A node is known by its name (`[localhost]:PORT`) and by its address (`[127.0.0.1]:PORT`): a
key recorded under either that differs from the one the server shows is a CHANGED key,
refused even with --accept-new-host-key. Accepting a new key saves exactly the key whose
fingerprint the user was shown, never a key fetched again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncssh
import pytest

from console.fleet import Node
from console.transport import HostKeyProblem, accept_host_key, ssh_connect
from tests.servers.sshd import SshServer

ROOT = Path(__file__).resolve().parents[2]


def other_key(tmp_path: Path) -> str:
    """A host key that is not the server's: 'TYPE BASE64'."""
    path = tmp_path / f"other_host_key_{len(list(tmp_path.glob('other_host_key_*.pub')))}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def server_key(sshd: SshServer) -> str:
    return " ".join(sshd.host_public_key.read_text().split()[:2])


def node_for(sshd: SshServer, known: Path, host: str = "localhost") -> Node:
    return Node(name="gen-1", host=host, port=sshd.port, user=sshd.user,
                identity_file=str(sshd.client_key), known_hosts=str(known), run_dir="/tmp",
                connect_timeout_s=30)


def fleet_file(tmp_path: Path, node: Node) -> Path:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("\n".join([
        "[[nodes]]", f'name = "{node.name}"', f'host = "{node.host}"', f"port = {node.port}",
        f'user = "{node.user}"', f'identity_file = "{node.identity_file}"',
        f'known_hosts = "{node.known_hosts}"', 'run_dir = "/tmp"',
        f'agent = "{sys.executable} -m agents.cli"', "connect_timeout_s = 30", ""]))
    return fleet


def fleetdeck(fleet: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet), *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)


def keygen_find(known: Path, name: str) -> list[str]:
    """The key lines OpenSSH finds for `name` in `known` ('TYPE BASE64' each)."""
    r = subprocess.run(["ssh-keygen", "-F", name, "-f", str(known)], capture_output=True,
                       text=True)
    return [" ".join(line.split()[1:3]) for line in r.stdout.splitlines()
            if line and not line.startswith("#")]


async def connects(node: Node) -> bool:
    conn = await ssh_connect(node)
    conn.close()
    return True


async def problem_of(node: Node) -> HostKeyProblem:
    with pytest.raises(HostKeyProblem) as caught:
        await connects(node)
    return caught.value


async def test_a_key_changed_under_the_address_is_changed_for_a_host_name(
        sshd: SshServer, tmp_path: Path) -> None:
    """The issue's case: the key stored under [127.0.0.1]:PORT differs; host = "localhost".
    It was accepted as a *new* key with --accept-new-host-key."""
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other_key(tmp_path)}\n")
    before = known.read_bytes()
    node = node_for(sshd, known)
    problem = await problem_of(node)
    assert problem.kind == "changed" and "CHANGED" in str(problem)
    r = fleetdeck(fleet_file(tmp_path, node), "--accept-new-host-key", "status")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "CHANGED" in r.stdout and "Traceback" not in r.stderr
    assert known.read_bytes() == before, "a changed key was saved"
    with pytest.raises(HostKeyProblem):
        await accept_host_key(node, problem)  # never saves a changed key, asked directly
    assert known.read_bytes() == before


async def test_a_wrong_key_by_address_beside_the_right_one_by_name_is_changed(
        sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[localhost]:{sshd.port} {server_key(sshd)}\n"
                     f"[127.0.0.1]:{sshd.port} {other_key(tmp_path)}\n")
    problem = await problem_of(node_for(sshd, known))
    assert problem.kind == "changed"
    # The same by name, with the address right: also changed.
    known.write_text(f"[localhost]:{sshd.port} {other_key(tmp_path)}\n"
                     f"[127.0.0.1]:{sshd.port} {server_key(sshd)}\n")
    assert (await problem_of(node_for(sshd, known))).kind == "changed"


async def test_the_right_key_by_name_and_address_connects(sshd: SshServer,
                                                          tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[localhost]:{sshd.port},[127.0.0.1]:{sshd.port} {server_key(sshd)}\n")
    assert await connects(node_for(sshd, known))
    known.write_text(f"[127.0.0.1]:{sshd.port} {server_key(sshd)}\n")
    assert await connects(node_for(sshd, known, host="127.0.0.1"))
    # A key stored under the plain name (port 22's form) is not this port's, as in OpenSSH.
    known.write_text(f"localhost {other_key(tmp_path)}\n")
    assert (await problem_of(node_for(sshd, known))).kind == "unknown"


async def test_accepting_writes_a_line_openssh_reads_under_name_and_address(
        sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "fresh" / "known_hosts"  # no file yet: created
    node = node_for(sshd, known)
    problem = await problem_of(node)
    assert problem.kind == "unknown" and problem.fingerprint
    assert await accept_host_key(node, problem) == problem.fingerprint
    assert keygen_find(known, f"[localhost]:{sshd.port}") == [server_key(sshd)]
    assert keygen_find(known, f"[127.0.0.1]:{sshd.port}") == [server_key(sshd)]
    assert await connects(node)
    # OpenSSH itself, checking strictly (and by address too), trusts what was written.
    r = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                        "-o", "CheckHostIP=yes", "-o", f"UserKnownHostsFile={known}",
                        "-o", "GlobalKnownHostsFile=/dev/null", "-i", str(sshd.client_key),
                        "-p", str(sshd.port), f"{sshd.user}@localhost", "true"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    # A file without a final newline is not glued to: the new line stands on its own.
    other = tmp_path / "known_other"
    other.write_text(f"example.org {other_key(tmp_path)}")
    problem = await problem_of(node_for(sshd, other))
    await accept_host_key(node_for(sshd, other), problem)
    assert keygen_find(other, "example.org") and \
        keygen_find(other, f"[localhost]:{sshd.port}") == [server_key(sshd)]


async def test_accept_saves_the_key_that_was_shown_not_one_fetched_again(
        sshd: SshServer, tmp_path: Path) -> None:
    """Between the question and the answer another server takes the port (a man in the
    middle, or a rebuilt node): accepting saves the key whose fingerprint was shown."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    node = node_for(sshd, known)
    problem = await problem_of(node)
    shown = problem.fingerprint
    sshd.kill()
    impostor_key = asyncssh.generate_private_key("ssh-ed25519")
    impostor = await asyncssh.listen("127.0.0.1", sshd.port, server_host_keys=[impostor_key],
                                     reuse_address=True)
    try:
        fingerprint = await accept_host_key(node, problem)
    finally:
        impostor.close()
        await impostor.wait_closed()
    assert fingerprint == shown != impostor_key.get_fingerprint()
    assert keygen_find(known, f"[localhost]:{sshd.port}") == [server_key(sshd)]


def test_headless_accepts_an_unknown_key_once_and_never_a_changed_one(
        sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    fleet = fleet_file(tmp_path, node_for(sshd, known))
    r = fleetdeck(fleet, "status")
    assert r.returncode == 3 and "unknown host key SHA256:" in r.stdout, r.stdout + r.stderr
    assert known.read_text() == ""
    r = fleetdeck(fleet, "--accept-new-host-key", "status")
    assert "accepted new host key SHA256:" in r.stderr, r.stdout + r.stderr
    assert keygen_find(known, f"[localhost]:{sshd.port}") == [server_key(sshd)]
    lines = known.read_text()
    r = fleetdeck(fleet, "--accept-new-host-key", "status")
    assert "accepted" not in r.stderr and known.read_text() == lines  # known now: once
    assert os.stat(known).st_size == len(lines.encode())


async def test_no_answer_is_unreachable_not_a_host_key_question(tmp_path: Path) -> None:
    dead = Node(name="gone", host="127.0.0.1", port=9, run_dir="/tmp",
                known_hosts=str(tmp_path / "none" / "known_hosts"), connect_timeout_s=2)
    with pytest.raises(ConnectionError) as caught:
        await asyncio.wait_for(ssh_connect(dead), 120)
    assert not isinstance(caught.value, HostKeyProblem)
    assert not (tmp_path / "none").exists()
