"""`fleetdeck bootstrap NODE`: install or upgrade the agent on a node over SSH.

The wheel of the running version is copied over SFTP into the node's agent folder and
installed into a virtual environment there; the node's `agent` command (from the fleet file)
then points into it. A bare node with Python 3.11 is one command away.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

import asyncssh

from agents import __version__
from console.fleet import Fleet, Node
from console.transport import AgentLink, Unreachable, ssh_connect

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class BootstrapError(RuntimeError):
    pass


def local_wheel(cache: Path | None = None) -> Path:
    """The wheel of this very version: built from the checkout we run from, else downloaded."""
    checkout = (PROJECT_ROOT / "pyproject.toml").exists()
    # From a checkout the code may have changed under the same version: build afresh.
    cache = cache or (Path(tempfile.mkdtemp(prefix="fleetdeck-wheel-")) if checkout else
                      Path(tempfile.gettempdir()) / f"fleetdeck-wheels-{__version__}")
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"fleetdeck-{__version__}-*.whl"))
    if found:
        return found[-1]
    if checkout:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(cache),
               str(PROJECT_ROOT)]
    else:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
               f"fleetdeck=={__version__}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(f"fleetdeck-{__version__}-*.whl"))
    if done.returncode != 0 or not found:
        raise BootstrapError(f"cannot make the fleetdeck {__version__} wheel: "
                             f"{done.stderr.strip()[-500:]}")
    return found[-1]


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


async def bootstrap(node: Node, log: bool = True) -> str:
    if node.local:
        raise BootstrapError(f"node {node.name} is local; nothing to install")
    venv = venv_of(node)
    wheel = local_wheel()
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
        await _run(conn, f"mkdir -p {shlex.quote(stage)}", "creating the wheel folder")
        async with conn.start_sftp_client() as sftp:
            await sftp.put(str(wheel), f"{stage}/{wheel.name}")
        if log:
            print(f"{node.name}: copied {wheel.name}; installing into {venv_abs}",
                  file=sys.stderr)
        await _run(conn, f"test -x {shlex.quote(venv_abs)}/bin/python || python3 -m venv "
                   f"{shlex.quote(venv_abs)}", "creating the virtual environment")
        await _run(conn, f"{shlex.quote(venv_abs)}/bin/python -m pip install -q "
                   f"--disable-pip-version-check --upgrade {shlex.quote(stage)}/{wheel.name}",
                   "pip install")
        out = await _run(conn, f"{_remote(node.agent)} --version", "running the agent")
    return out.strip()


async def cmd_bootstrap(fleet: Fleet, args: argparse.Namespace) -> int:
    node = fleet.node(args.node_name)
    try:
        version = await bootstrap(node)
    except (BootstrapError, Unreachable) as exc:
        print(f"fleetdeck bootstrap: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, Unreachable) else 1
    print(f"{node.name}: {version}", file=sys.stderr)
    link = AgentLink(node)
    try:
        hello = await link.connect()
    except Unreachable as exc:
        print(f"fleetdeck bootstrap: installed, but hello failed: {exc}", file=sys.stderr)
        return 1
    finally:
        await link.close()
    print(f'{{"node": "{node.name}", "agent_version": "{hello["agent_version"]}"}}')
    return 0
