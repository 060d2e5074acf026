"""A real OpenSSH sshd on a free loopback port, with its own host key and client key."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers.ports import dies_with_tests, free_ports, kill_pid, wait_until

SSHD = "/usr/sbin/sshd"


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )


def _banner(port: int) -> bool:
    try:
        # Seconds, not half of one: sshd forks and re-executes itself for each connection
        # before its banner, which a loaded machine can take longer than that over, each time.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


@dataclass
class SshServer:
    """What a client needs to connect, and the handles to make the node unreachable."""

    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    host_public_key: Path
    folder: Path
    proc: subprocess.Popen[bytes] = field(repr=False)

    def freeze(self) -> None:
        """SIGSTOP: the port stays open but nothing answers (a hung node)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: connections are refused (a dead node)."""
        kill_pid(self.proc)

    def log_text(self) -> str:
        return (self.folder / "sshd.log").read_text(errors="replace")

    def add_key(self, name: str, options: str = "") -> Path:
        """A new client key, authorized with an options prefix (for example
        `command="...",restrict`: a forced command); returns its private key file."""
        key = self.folder / f"id_{name}"
        _keygen(key, f"fleetdeck-test-{name}")
        line = key.with_suffix(".pub").read_text().strip()
        with open(self.folder / "authorized_keys", "a") as f:
            f.write(f"{options} {line}\n" if options else f"{line}\n")
        return key


def start_sshd(folder: Path) -> SshServer:
    if not os.path.exists(SSHD):
        raise RuntimeError(f"{SSHD} is missing: install openssh-server (make test does)")
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    host_key = folder / "ssh_host_ed25519_key"
    client_key = folder / "id_ed25519"
    _keygen(host_key, "fleetdeck-test-host")
    _keygen(client_key, "fleetdeck-test-client")
    shutil.copy(client_key.with_suffix(".pub"), folder / "authorized_keys")
    (port,) = free_ports(1)
    user = getpass.getuser()
    host_pub = host_key.with_suffix(".pub").read_text().split()
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    config = folder / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {folder / 'sshd.pid'}",
                f"AuthorizedKeysFile {folder / 'authorized_keys'}",
                # Keys live under /tmp, which StrictModes would reject.
                "StrictModes no",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "PermitRootLogin prohibit-password",
                f"AllowUsers {user}",
                "Subsystem sftp internal-sftp",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        # The privilege-separation directory sshd insists on when started as root.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open(folder / "sshd.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=dies_with_tests(),
    )
    log.close()
    try:
        wait_until(lambda: _banner(port), 120, f"sshd on 127.0.0.1:{port}", proc)
    except Exception:
        kill_pid(proc)
        raise
    return SshServer(
        host="127.0.0.1",
        port=port,
        user=user,
        client_key=client_key,
        known_hosts=known_hosts,
        host_public_key=host_key.with_suffix(".pub"),
        folder=folder,
        proc=proc,
    )


@contextmanager
def running_sshd() -> Iterator[SshServer]:
    """An sshd in a short temporary folder of its own (sshd and Unix sockets dislike long
    paths), killed on the way out."""
    with tempfile.TemporaryDirectory(prefix="fd-sshd-") as d:
        server = start_sshd(Path(d))
        try:
            yield server
        finally:
            server.kill()
