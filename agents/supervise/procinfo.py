"""Process identity on Linux: a pid is only the same process if its start time matches too.

A supervisor that adopts servers after a crash compares (pid, start time, port): pids are
reused, start times are not.
"""

from __future__ import annotations

import os
import signal


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rfind(b")") + 2 :][:1] != b"Z"
    except FileNotFoundError:
        return False


def same_process(pid: int, started: int) -> bool:
    return alive(pid) and start_time(pid) == started


def kill_group(pid: int, sig: int = signal.SIGTERM) -> None:
    """Signal a server's whole process group (it was started in a session of its own)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
