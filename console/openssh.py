"""OpenSSH's own client (`ssh`, `sftp`) pointed at a fleet node: the options written once from
the fleet file's settings, so every OpenSSH process checks the host key as the agent link does.

Host keys are checked strictly against the node's known_hosts, by name and by address (the
console has verified or accepted the key already); `~/.ssh/config` is honoured by OpenSSH
itself. Values are %-escaped (OpenSSH expands %-tokens in paths) and quoted when they hold
whitespace (it splits `-o Key=value` there).
"""

from __future__ import annotations

import math
import os

from console.fleet import Node
from console.transport import known_hosts_path


def option_value(text: str) -> str:
    """An `-o Key=value` value: ssh expands %-tokens in paths and splits on whitespace."""
    text = text.replace("%", "%%")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def client_options(node: Node) -> list[str]:
    """The options every OpenSSH client run against the node takes: the host key checked
    strictly by name and address, its known_hosts, timeouts, identity, port and user."""
    opts = ["-o", "StrictHostKeyChecking=yes",
            # By address too, as the agent link checks (console/transport.py): a key recorded
            # under the node's IP that differs stops the connection.
            "-o", "CheckHostIP=yes",
            "-o", f"UserKnownHostsFile={option_value(known_hosts_path(node))}",
            "-o", f"ConnectTimeout={max(1, math.ceil(node.connect_timeout_s))}",
            # A node that stops answering ends the client instead of hanging it.
            "-o", f"ServerAliveInterval={max(1, math.ceil(node.keepalive_s))}",
            "-o", "ServerAliveCountMax=3"]
    if node.identity_file:
        opts += ["-i", os.path.expanduser(node.identity_file).replace("%", "%%")]
    if node.port:
        opts += ["-o", f"Port={node.port}"]
    if node.user:
        opts += ["-o", f"User={option_value(node.user)}"]
    return opts
