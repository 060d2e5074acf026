"""Bootstrap installs only a wheel it built or was handed (issue 11, item 4), over the real
sshd.

Before: a console running from an installed package (no checkout) took any
`fleetdeck-*.whl` in $TMPDIR/fleetdeck-wheels-VERSION/ (where another local user can put
one), else downloaded `fleetdeck==VERSION` by name from a public index. Now: a wheel built
from the checkout into a private folder, or `--wheel PATH`; without either, exit 2 saying so;
and the wheel's sha256 is checked on the node before pip sees it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agents import __version__
from console.bootstrap import BootstrapError, check_on_node, wheel_to_install
from console.fleet import Node
from console.transport import ssh_connect
from tests.servers.sshd import SshServer

ROOT = Path(__file__).resolve().parents[2]


def installed_copy(where: Path) -> Path:
    """The console's code without its checkout (no pyproject.toml beside it): what running
    from an installed wheel looks like to bootstrap."""
    for package in ("agents", "console"):
        shutil.copytree(ROOT / package, where / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return where


def fleet_for(sshd: SshServer, tmp_path: Path, venv: Path) -> Path:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("\n".join([
        "[[nodes]]", 'name = "gen-1"', 'host = "127.0.0.1"', f"port = {sshd.port}",
        f'user = "{sshd.user}"', f'identity_file = "{sshd.client_key}"',
        f'known_hosts = "{sshd.known_hosts}"', f'run_dir = "{tmp_path}"',
        f'agent = "{venv}/bin/fleetdeck-agent"', "connect_timeout_s = 30", ""]))
    return fleet


def bootstrap(code: Path, fleet: Path, *args: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet),
                           "bootstrap", "gen-1", *args], cwd=code, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(code), **(env or {})})


def test_an_installed_console_never_takes_a_planted_wheel_and_says_pass_wheel(
        sshd: SshServer, tmp_path: Path) -> None:
    code = installed_copy(tmp_path / "site")
    shared = tmp_path / "shared-tmp"  # $TMPDIR, where anyone may create folders
    planted = shared / f"fleetdeck-wheels-{__version__}"
    planted.mkdir(parents=True)
    (planted / f"fleetdeck-{__version__}-py3-none-any.whl").write_bytes(b"not yours\n")
    venv = tmp_path / "node-home" / "venv"
    fleet = fleet_for(sshd, tmp_path, venv)
    r = bootstrap(code, fleet, env={"TMPDIR": str(shared)})
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, r.stderr
    assert "--wheel" in r.stderr and "checkout" in r.stderr and "downloaded" in r.stderr
    assert not venv.parent.exists(), "something reached the node"
    r = bootstrap(code, fleet, "--wheel", str(tmp_path / "nope.whl"))
    assert r.returncode == 2 and "no such file" in r.stderr, r.stderr
    r = bootstrap(code, fleet, "--wheel", str(planted.parent / "x.tar.gz"))
    assert r.returncode == 2, r.stderr
    assert not venv.parent.exists()


def test_an_installed_console_installs_the_wheel_it_is_given(sshd: SshServer,
                                                             tmp_path: Path) -> None:
    built = tmp_path / "built"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(built),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = built.glob("fleetdeck-*.whl")
    code = installed_copy(tmp_path / "site")
    venv = tmp_path / "node-home" / "venv"
    r = bootstrap(code, fleet_for(sshd, tmp_path, venv), "--wheel", str(wheel))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checked on the node" in r.stderr
    assert json.loads(r.stdout)["agent_version"] == __version__
    staged = Path(f"{venv}.wheels")
    assert stat.S_IMODE(staged.stat().st_mode) == 0o700
    assert hashlib.sha256((staged / wheel.name).read_bytes()).hexdigest() == \
        hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_a_checkout_builds_into_a_private_folder_it_removes(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    shared = tmp_path / "shared-tmp"
    planted = shared / f"fleetdeck-wheels-{__version__}"
    planted.mkdir(parents=True)
    (planted / f"fleetdeck-{__version__}-py3-none-any.whl").write_bytes(b"not yours\n")
    monkeypatch.setenv("TMPDIR", str(shared))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    with wheel_to_install() as wheel:
        folder = wheel.parent
        st = folder.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        assert folder != planted and wheel.read_bytes()[:2] == b"PK"  # a zip, built here
    assert not folder.exists()


async def test_a_wheel_changed_on_the_way_is_not_installed(sshd: SshServer,
                                                           tmp_path: Path) -> None:
    node = Node(name="gen-1", host="127.0.0.1", port=sshd.port, user=sshd.user,
                identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                run_dir=str(tmp_path), connect_timeout_s=30)
    remote = tmp_path / "stage" / "fleetdeck-0-py3-none-any.whl"
    remote.parent.mkdir()
    remote.write_bytes(b"what arrived\n")
    sent = hashlib.sha256(b"what was sent\n").hexdigest()
    conn = await ssh_connect(node)
    try:
        await check_on_node(conn, str(remote), hashlib.sha256(b"what arrived\n").hexdigest())
        assert remote.exists()
        with pytest.raises(BootstrapError) as caught:
            await check_on_node(conn, str(remote), sent)
    finally:
        conn.close()
    assert sent in str(caught.value) and "not installed" in str(caught.value)
    assert not remote.exists()
