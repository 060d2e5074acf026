"""Alerts reach someone not staring at the screen: the configured command (a webhook call, a
pager script) runs once per new alert with the alert as JSON on its stdin, unless the node
paged it already (`[alerts] webhook`: the alert comes marked `paged`)."""

from __future__ import annotations

import asyncio
import os
import time

import msgspec

from agents.rundir.schema import Alert

COMMAND_TIMEOUT_S = 30.0


def alert_json(node: str, alert: Alert) -> bytes:
    return msgspec.json.encode({"node": node, "time": time.time(),
                                "alert": msgspec.to_builtins(alert)}) + b"\n"


async def run_alert_command(command: str, node: str, alert: Alert,
                            timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Run `command` (a shell line) with the alert on stdin; nothing for an alert the node
    paged itself (one page per alert, not one per console). Raises RuntimeError naming the
    command and how it failed; never blocks the caller's loop."""
    if alert.paged:
        return
    proc = await asyncio.create_subprocess_shell(
        os.path.expanduser(command), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(alert_json(node, alert)), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"alert command {command!r} did not finish within "
                           f"{timeout:.0f} s; killed") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"alert command {command!r} exited {proc.returncode}: {tail[0]}")
