"""A shell on a node, for the engineer at the keyboard: the command line that opens one in the
node's run directory. `ssh -t` with the fleet file's settings (console/openssh.py: the host key
checked strictly, as the agent link checks it), or, for a `local` node, the user's shell here.
Running it, with the terminal lent, is the TUI's part (console/tui/terminal.py)."""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass

from console.fleet import Node
from console.openssh import client_options

# ssh's own exit status when it could not connect, or lost the connection.
SSH_FAILED = 255


class NoShell(Exception):
    """No shell can be opened on the node; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class ShellCommand:
    argv: list[str]
    cwd: str | None  # where it starts here: a local node's run dir; ssh cds on the node itself
    node: str

    def held(self, code: int) -> str | None:
        """What to show before the TUI comes back over the terminal, or None to come back at
        once. ssh's own errors (unknown host key, refused key, no route) are printed to the
        terminal and would be drawn over."""
        if code != SSH_FAILED or self.cwd is not None:
            return None
        return (f"\nfleetdeck: ssh to {self.node} ended with {code}: it could not connect, or "
                "the connection broke (see above). Press Enter to go back to fleetdeck.")


def remote_command(run_dir: str) -> str:
    """What the node runs: into RUN_DIR, then the user's login shell in its place. Where
    RUN_DIR is not (the run never launched, another disk), the shell opens in the home folder
    and says so. Run by `sh -c`, so that a login shell that is not POSIX (fish, csh) reads it
    alike; RUN_DIR is quoted for sh, the script once more for the login shell."""
    script = (f"cd -- {shlex.quote(run_dir)} || "
              "echo 'fleetdeck: the shell opens in '\"$HOME\" >&2; "
              'exec "${SHELL:-/bin/sh}" -l')
    return "exec sh -c " + shlex.quote(script)


def shell_command(node: Node, ssh: str | None = None) -> ShellCommand:
    """The command that opens a shell on the node in its run dir; NoShell names what is
    missing (no ssh here, a local node's run dir missing)."""
    if node.local:
        if not os.path.isdir(node.run_dir):
            raise NoShell(f"{node.name}: no folder {node.run_dir} here (the local node's "
                          "run_dir)")
        return ShellCommand([os.environ.get("SHELL") or "/bin/sh"], node.run_dir, node.name)
    ssh = ssh or shutil.which("ssh")
    if ssh is None:
        raise NoShell(f"{node.name}: ssh is not installed here; install OpenSSH's client "
                      "(Debian: apt-get install openssh-client)")
    # -t: a terminal on the node even though a command is given. The host as the fleet file
    # writes it: ssh takes a bare IPv6 address (sftp needs brackets, ssh does not); `--` ends
    # the options before it.
    return ShellCommand([ssh, "-t", *client_options(node), "--", node.host or "",
                         remote_command(node.run_dir)], None, node.name)
