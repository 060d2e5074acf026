"""`fleetdeck bootstrap NODE`: install or upgrade the agent on a node over SSH.

The wheel is copied over SFTP into the node's agent folder, its sha256 checked there, and
installed into a virtual environment there; the node's `agent` command (from the fleet file)
then points into it. A bare node with Python 3.11 is one command away.

Which wheel: one built here from the checkout the console runs from, into a private folder
(mkdtemp, 0700) that no other local user can put a file in; or the one named by
`--wheel PATH`. Nothing else: never a wheel found in a shared temporary folder, never one
downloaded by name from a package index (which may hold someone else's `fleetdeck`). Without
a checkout and without --wheel, bootstrap exits 2 and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

import asyncssh

from agents import __version__
from console.fleet import Fleet, Node
from console.sanitize import shown
from console.transport import AgentLink, Unreachable, ssh_connect

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class BootstrapError(RuntimeError):
    pass


class NoWheel(BootstrapError):
    """No wheel bootstrap may install: a usage error (exit 2)."""


def is_checkout(root: Path = PROJECT_ROOT) -> bool:
    return (root / "pyproject.toml").is_file()


@contextmanager
def wheel_to_install(explicit: str | Path | None = None) -> Iterator[Path]:
    """The wheel to install: `explicit` (--wheel PATH), else one built now from the checkout
    the console runs from, in a private folder removed afterwards. Never a wheel found lying
    around, never one downloaded by name."""
    if explicit is not None:
        wheel = Path(explicit).expanduser()
        if not wheel.is_file():
            raise NoWheel(f"--wheel {wheel}: no such file")
        if not (wheel.name.startswith("fleetdeck-") and wheel.name.endswith(".whl")):
            raise NoWheel(f"--wheel {wheel}: not a fleetdeck wheel (fleetdeck-VERSION-*.whl)")
        yield wheel
        return
    if not is_checkout():
        raise NoWheel(f"this console runs from an installed package ({PROJECT_ROOT}), not a "
                      "checkout, so it has no wheel it built itself: pass --wheel PATH (the "
                      f"fleetdeck {__version__} wheel you trust), or run bootstrap from a "
                      "fleetdeck checkout. Nothing is downloaded by name.")
    # mkdtemp: a new folder, mode 0700, that only this user can put files in.
    private = Path(tempfile.mkdtemp(prefix="fleetdeck-wheel-"))
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                               "-w", str(private), str(PROJECT_ROOT)],
                              capture_output=True, text=True)
        found = sorted(private.glob(f"fleetdeck-{__version__}-*.whl"))
        if done.returncode != 0 or len(found) != 1:
            raise BootstrapError(f"cannot build the fleetdeck {__version__} wheel from "
                                 f"{PROJECT_ROOT}: {done.stderr.strip()[-500:]}")
        yield found[0]
    finally:
        shutil.rmtree(private, ignore_errors=True)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


SHA256_ON_NODE = ("python3 -c 'import hashlib, sys; f = open(sys.argv[1], \"rb\"); "
                  "print(hashlib.file_digest(f, \"sha256\").hexdigest())'")


async def check_on_node(conn: asyncssh.SSHClientConnection, remote: str, sha256: str) -> None:
    """The file the node will install is the one we sent: its sha256, computed on the node,
    must be `sha256`; else it is deleted there and BootstrapError says both."""
    got = (await _run(conn, f"{SHA256_ON_NODE} {shlex.quote(remote)}",
                      "hashing the wheel on the node")).strip()
    if got != sha256:
        await conn.run(f"rm -f -- {shlex.quote(remote)}", check=False)
        raise BootstrapError(f"the wheel on the node ({remote}) has sha256 {got[:64]!r}, not "
                             f"{sha256} as sent: not installed, and removed there")


def venv_of(node: Node) -> str:
    """The node's agent command is VENV/bin/fleetdeck-agent: the venv to install into."""
    agent = PurePosixPath(node.agent.split()[0])
    if agent.name != "fleetdeck-agent" or agent.parent.name != "bin":
        raise BootstrapError(f"node {node.name}: agent = {node.agent!r} is not "
                             "VENV/bin/fleetdeck-agent; bootstrap installs into such a venv")
    return str(agent.parent.parent)


async def _run(conn: asyncssh.SSHClientConnection, cmd: str, what: str) -> str:
    result = await conn.run(cmd, check=False)
    if result.exit_status != 0:
        raise BootstrapError(f"{what} failed (exit {result.exit_status}): "
                             f"{str(result.stderr or result.stdout).strip()[-800:]}")
    return str(result.stdout)


def _remote(path: str) -> str:
    """A path for the remote shell, with a leading ~ left for it to expand."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


async def bootstrap(node: Node, wheel: Path, log: bool = True) -> str:
    if node.local:
        raise BootstrapError(f"node {node.name} is local; nothing to install")
    venv = venv_of(node)
    sha256 = file_sha256(wheel)
    conn = await ssh_connect(node)
    async with conn:
        home = (await _run(conn, "echo $HOME", "finding the home folder")).strip()
        venv_abs = venv.replace("~", home, 1) if venv.startswith("~") else venv
        stage = f"{venv_abs}.wheels"
        version = await _run(conn, "python3 -c 'import sys; print(sys.version_info[:2] >= "
                             "(3, 11), sys.version.split()[0])'", "checking python3")
        ok, _, pyver = version.strip().partition(" ")
        if ok != "True":
            raise BootstrapError(f"node {node.name}: python3 is {pyver}; fleetdeck needs 3.11+")
        await _run(conn, f"mkdir -p -m 700 {shlex.quote(stage)}", "creating the wheel folder")
        remote = f"{stage}/{wheel.name}"
        async with conn.start_sftp_client() as sftp:
            await sftp.put(str(wheel), remote)
        await check_on_node(conn, remote, sha256)
        if log:
            print(f"{node.name}: copied {wheel.name} (sha256 {sha256[:16]}, checked on the "
                  f"node); installing into {venv_abs}", file=sys.stderr)
        await _run(conn, f"test -x {shlex.quote(venv_abs)}/bin/python || python3 -m venv "
                   f"{shlex.quote(venv_abs)}", "creating the virtual environment")
        await _run(conn, f"{shlex.quote(venv_abs)}/bin/python -m pip install -q "
                   f"--disable-pip-version-check --upgrade {shlex.quote(remote)}",
                   "pip install")
        out = await _run(conn, f"{_remote(node.agent)} --version", "running the agent")
    return out.strip()


async def cmd_bootstrap(fleet: Fleet, args: argparse.Namespace) -> int:
    node = fleet.node(args.node_name)
    try:
        with wheel_to_install(getattr(args, "wheel", None)) as wheel:
            version = await bootstrap(node, wheel)
    except (BootstrapError, Unreachable) as exc:
        print(f"fleetdeck bootstrap: {shown(exc, multiline=True)}", file=sys.stderr)
        return 3 if isinstance(exc, Unreachable) else 2 if isinstance(exc, NoWheel) else 1
    print(f"{node.name}: {shown(version)}", file=sys.stderr)
    link = AgentLink(node)
    try:
        hello = await link.connect()
    except Unreachable as exc:
        print(f"fleetdeck bootstrap: installed, but hello failed: {shown(exc)}",
              file=sys.stderr)
        return 1
    finally:
        await link.close()
    # JSON written by json (the version is the node's word: quoted and escaped, not pasted).
    print(json.dumps({"node": node.name, "agent_version": hello.get("agent_version")}))
    return 0
