"""Host keys in the TUI, over the real sshd: an unknown key is asked about with its
fingerprint (yes trusts it and connects; no leaves the node unconnected); a changed key is an
error and is never offered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.widgets.hostkey import HostKeyModal
from tests.console.conftest import on_screen, until
from tests.console.screen import Recorder
from tests.servers.sshd import SshServer


def ssh_fleet(sshd: SshServer, known_hosts: Path, run_dir: Path) -> Fleet:
    run_dir.mkdir(exist_ok=True)
    node = Node(name="remote", run_dir=str(run_dir), host=sshd.host, port=sshd.port,
                user=sshd.user, identity_file=str(sshd.client_key),
                known_hosts=str(known_hosts), agent=f"{sys.executable} -m agents.cli",
                connect_timeout_s=30)
    return Fleet(nodes=[node], console=ConsoleSettings(bell=False), source="fleet.toml")


def fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[1]


async def test_unknown_host_key_asked_then_trusted(sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    app = FleetdeckApp(ssh_fleet(sshd, known, tmp_path / "run"))
    async with app.run_test(size=(120, 40)) as pilot:
        modal = await until(pilot, lambda: on_screen(app, HostKeyModal),
                            120, "the host key question")
        assert fingerprint(sshd.host_public_key) in str(modal.detail)
        assert app.state.nodes["remote"].link == "host key"
        await pilot.press("y")
        await until(pilot, lambda: app.state.nodes["remote"].link == "connected", 120,
                    "connected after trusting the key")
        assert str(sshd.port) in known.read_text()


async def test_unknown_host_key_refused(sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    rec = Recorder()
    app = FleetdeckApp(ssh_fleet(sshd, known, tmp_path / "run"))
    async with app.run_test(size=(120, 40), message_hook=rec) as pilot:
        await until(pilot, lambda: on_screen(app, HostKeyModal), 120, "the question")
        await pilot.press("n")
        await until(pilot, lambda: rec.has("host key not trusted"), 120, "the refusal noted")
        assert app.state.nodes["remote"].link == "host key"
        assert known.read_text() == ""
        # Nothing more is tried until someone decides: the node's link worker has ended.
        await until(pilot, lambda: all(w.is_finished for w in app.workers
                                       if w.name.startswith("link-")), 120, "the link stopped")


async def test_changed_host_key_is_an_error_never_offered(sshd: SshServer,
                                                          tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{sshd.host}]:{sshd.port} {kind} {key}\n")
    rec = Recorder()
    app = FleetdeckApp(ssh_fleet(sshd, known, tmp_path / "run"))
    async with app.run_test(size=(120, 40), message_hook=rec) as pilot:
        await until(pilot, lambda: rec.has("host key CHANGED"), 120, "the changed key error")
        assert not isinstance(app.screen, HostKeyModal)
        assert app.state.nodes["remote"].link == "host key"
