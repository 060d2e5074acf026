"""Crash and fault points for tests.

FLEETDECK_CRASH_AT=name[:n] SIGKILLs this process at the n-th pass of crash point `name`.
Names: lines_written (written, not fsynced), lines_fsynced (fsynced, indices not recorded),
batch_close (renamed, directory not fsynced), upload (object put, not yet confirmed),
hedge_sent (a second copy of a request sent), hedge_won (the first answer of a hedged request
kept, the others not yet aborted); and a campaign node's queue (agents/queue/worker.py):
queue_claim (a chunk's lease created, not yet journaled here), queue_renew (a lease renewed),
queue_commit (a chunk's commit created in S3, its outcome not yet journaled here).

FLEETDECK_CRASH_MARKS=FILE appends the name of every crash point passed to FILE (one write per
pass, not fsynced) and kills nothing: on the power-loss harness's mount each pass is then an
op in its log, so a test can cut the power at exactly every crash point of one recording.

FLEETDECK_FAIL_AT=name[:n] makes a write fail from the n-th pass of fault point `name` on, as a
full disk does: with FLEETDECK_FAIL_BYTES=k the first failing write gets k bytes onto the file
before the error (a torn write), and FLEETDECK_FAIL_ERRNO picks the error (ENOSPC by default;
EFBIG, EIO, EDQUOT...). Fault points: write_group (a group of batch lines), record (its
indices in .done_indices), journal (failures.jsonl), uploads (uploads.jsonl).
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass

_spec = os.environ.get("FLEETDECK_CRASH_AT", "")
_name, _, _count = _spec.partition(":")
_remaining = int(_count) if _count else 1
_marks = os.environ.get("FLEETDECK_CRASH_MARKS", "")
ARMED = bool(_name) or bool(_marks)
_marks_fd = -1


@dataclass(slots=True)
class Fault:
    """An armed fault point: fails from its n-th pass on."""

    name: str
    remaining: int = 1
    after_bytes: int = 0
    errno: int = errno.ENOSPC
    fired: bool = False

    def error(self) -> OSError:
        return OSError(self.errno, f"{os.strerror(self.errno)} (FLEETDECK_FAIL_AT={self.name})")


_fault: Fault | None = None


def arm_fault(name: str, count: int = 1, after_bytes: int = 0,
              err: int = errno.ENOSPC) -> None:
    """Arm fault point `name` (in-process tests; a process takes it from the environment)."""
    global _fault
    _fault = Fault(name, count, after_bytes, err)


def disarm_fault() -> None:
    global _fault
    _fault = None


def _arm_from_env() -> None:
    spec = os.environ.get("FLEETDECK_FAIL_AT", "")
    if not spec:
        return
    name, _, count = spec.partition(":")
    err_name = os.environ.get("FLEETDECK_FAIL_ERRNO", "ENOSPC")
    err = getattr(errno, err_name, None)
    if not isinstance(err, int):
        raise ValueError(f"FLEETDECK_FAIL_ERRNO={err_name!r} is not an errno name")
    arm_fault(name, int(count) if count else 1,
              int(os.environ.get("FLEETDECK_FAIL_BYTES", "0")), err)


_arm_from_env()


def fault_at(name: str) -> Fault | None:
    """The armed fault when this pass of point `name` must fail, else None."""
    f = _fault
    if f is None or f.name != name:
        return None
    f.remaining -= 1
    return f if f.remaining <= 0 else None


def fail_point(name: str) -> None:
    """Raise the armed error here when the fault point `name` is due (nothing is written)."""
    f = fault_at(name)
    if f is not None:
        raise f.error()


def write_all(fd: int, data: bytes, point: str) -> None:
    """os.write until all of `data` is on the file; at a due fault point, only the fault's
    first bytes (the first time it fires), then its error."""
    view = memoryview(data)
    f = fault_at(point) if _fault is not None else None
    if f is not None:
        view = view[:0] if f.fired else view[:f.after_bytes]
        f.fired = True
    while view:
        written = os.write(fd, view)
        view = view[written:]
    if f is not None:
        raise f.error()


def mark_to(path: str | None) -> None:
    """FLEETDECK_CRASH_MARKS for this process (in-process tests), None to stop."""
    global _marks, _marks_fd, ARMED
    if _marks_fd >= 0:
        os.close(_marks_fd)
        _marks_fd = -1
    _marks = path or ""
    ARMED = bool(_name) or bool(_marks)


def crash_point(name: str) -> None:
    global _remaining, _marks_fd
    if not ARMED:
        return
    if _marks:
        if _marks_fd < 0:
            _marks_fd = os.open(_marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_marks_fd, f"{name}\n".encode())
    if name != _name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
