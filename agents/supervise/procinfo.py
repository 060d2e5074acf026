"""Processes on Linux: identity (a pid is only the same process if its start time matches too),
process groups (a server and every process it started) and waiting for a child's exit.

A supervisor that adopts servers after a crash compares (pid, start time, port): pids are
reused, start times are not. A server runs in a session of its own, so its process group is
its launch process and every child (SGLang's scheduler and detokenizer): the group is what is
stopped, and what must be gone before a new server takes the same GPUs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """/proc/PID/stat from field 3 (state) on, or None when there is no such process. The
    command name (field 2) may hold spaces and parentheses: split after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    return data[data.rfind(b")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot (/proc/PID/stat field 22)."""
    rest = _stat_fields(pid)
    try:
        return int(rest[19]) if rest is not None else None
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
    rest = _stat_fields(pid)
    return rest is not None and rest[:1] != [b"Z"]


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


def group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` that still run (zombies, already dead, are left
    out), stopped ones included: /proc/PID/stat field 5 of every process."""
    out = []
    for entry in os.scandir("/proc"):
        if not (entry.name.isascii() and entry.name.isdigit()):
            continue
        rest = _stat_fields(entry.name)
        if rest is None or len(rest) < 3 or rest[0] in (b"Z", b"X"):
            continue
        if rest[2] == str(pgid).encode():
            out.append(int(entry.name))
    return sorted(out)


def group_is_ours(pid: int, started: int | None) -> bool:
    """Whether process group `pid` (a server started in a session of its own, with the start
    ticks `started`) is still the one we started. Linux keeps a pid number in use while it
    names a process group, so a group `pid` with members is ours unless the number now
    belongs to another process (the group is then long gone); a leader gone or a zombie is
    the group we started, its children still in it."""
    now = start_time(pid)
    return now is None or started is None or now == started


async def exit_status(proc: subprocess.Popen[bytes]) -> int:
    """The return code of our child `proc` once it exits (-N: killed by signal N), waited for
    on the event loop: a pidfd turns readable at the exit. No thread is left blocked in
    wait(), so a caller that stops waiting leaves nothing behind; a kernel without pidfds
    (before Linux 5.3) gets a look each second."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # reaped already (poll gives the code), or no pidfds here
        while proc.poll() is None:
            await asyncio.sleep(1.0)
        return proc.returncode
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    loop.add_reader(fd, exited.set)
    try:
        if proc.poll() is None:
            await exited.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()
