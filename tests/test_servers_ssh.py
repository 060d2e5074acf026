"""The sshd fixture is a real OpenSSH server: asyncssh connects with host keys checked."""

from __future__ import annotations

import asyncio

import asyncssh
import pytest

from tests.servers.sshd import SshServer


async def _connect(sshd: SshServer, known_hosts: object) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        sshd.host,
        port=sshd.port,
        username=sshd.user,
        client_keys=[str(sshd.client_key)],
        known_hosts=known_hosts,  # type: ignore[arg-type]
        agent_path=None,
        connect_timeout=60,
    )


async def test_runs_command_with_host_key_checked(sshd: SshServer) -> None:
    async with await _connect(sshd, str(sshd.known_hosts)) as conn:
        result = await conn.run("echo fleetdeck-$((6*7)); exit 3", check=False)
    assert result.stdout == "fleetdeck-42\n"
    assert result.exit_status == 3


async def test_wrong_host_key_is_refused(sshd: SshServer, tmp_path) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    wrong = tmp_path / "known_hosts"
    wrong.write_text(
        f"[{sshd.host}]:{sshd.port} {impostor.export_public_key().decode().strip()}\n"
    )
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await _connect(sshd, str(wrong))


async def test_unknown_client_key_is_refused(sshd: SshServer, tmp_path) -> None:
    stranger = tmp_path / "stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            sshd.host,
            port=sshd.port,
            username=sshd.user,
            client_keys=[str(stranger)],
            known_hosts=str(sshd.known_hosts),
            agent_path=None,
            connect_timeout=60,
        )


async def test_frozen_node_times_out_and_killed_node_refuses(sshd: SshServer) -> None:
    sshd.freeze()
    with pytest.raises((asyncio.TimeoutError, asyncssh.Error, OSError)):
        await asyncio.wait_for(_connect(sshd, str(sshd.known_hosts)), timeout=1.5)
    sshd.thaw()
    sshd.kill()
    with pytest.raises(OSError):
        await _connect(sshd, str(sshd.known_hosts))
