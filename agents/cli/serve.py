"""`fleetdeck-agent serve --stdio [--read-only] [--who NAME] RUN_DIR`: relay RPC for a console
over this process's stdio (one per console SSH session).

`--read-only` answers only what looks (status, logs, samples, history, verify) and refuses
everything that changes the run; `--who` names the person in the audit log. Both are meant for
a forced command in authorized_keys, where the client cannot change them:

    command="/opt/fleetdeck/bin/fleetdeck-agent serve --stdio --read-only --who oncall-alice \
/data/runs/r1",restrict ssh-ed25519 AAAA... oncall-alice
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
from pathlib import Path
from typing import Any

from agents.cli.exits import EXIT_USAGE

MAX_WHO = 64


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("serve", help="relay RPC for a console over this process's stdio")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--stdio", action="store_true", required=True)
    p.add_argument("--read-only", action="store_true",
                   help="refuse every method that changes something (a look-only key)")
    p.add_argument("--who", default=None, metavar="NAME",
                   help="who this session is, for the audit log (default: this account and "
                        "the SSH client's address); the client's own claim never counts")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from agents.rpc.serve import serve_stdio

    who = args.who
    if who is not None and (not who or len(who) > MAX_WHO or not who.isprintable()
                            or any(c.isspace() for c in who)):
        print(f"fleetdeck-agent serve: --who {who!r}: give a name of 1 to {MAX_WHO} printable "
              "characters without spaces", file=sys.stderr)
        return EXIT_USAGE
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)):
        what = _not_a_channel(stream.fileno())
        if what is not None:
            print(f"fleetdeck-agent serve --stdio: {name} is {what}; it must be a pipe, a socket "
                  "or a terminal (as sshd gives it: the console runs this over SSH)",
                  file=sys.stderr)
            return EXIT_USAGE
    return asyncio.run(serve_stdio(args.run_dir, read_only=args.read_only, who=who))


def _not_a_channel(fd: int) -> str | None:
    """What fd is when the event loop cannot wait on it (a regular file, /dev/null), else
    None: asyncio refuses those with a traceback, not a word on what was wrong."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        return f"not open ({exc.strerror})"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
        return None
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISCHR(mode):
        return "a character device that is not a terminal (/dev/null?)"
    return "neither a pipe nor a socket"
