"""Crash points for tests: FLEETDECK_CRASH_AT=name[:n] SIGKILLs this process at the n-th pass.

Names: lines_written (written, not fsynced), lines_fsynced (fsynced, indices not recorded),
batch_close (renamed, directory not fsynced), upload (object put, not yet confirmed).
"""

from __future__ import annotations

import errno
import os
import signal

_spec = os.environ.get("FLEETDECK_CRASH_AT", "")
_name, _, _count = _spec.partition(":")
_remaining = int(_count) if _count else 1
ARMED = bool(_name)


_fail_spec = os.environ.get("FLEETDECK_FAIL_AT", "")
_fail_name, _, _fail_count = _fail_spec.partition(":")
_fail_remaining = int(_fail_count) if _fail_count else 1


def fail_point(name: str) -> None:
    """FLEETDECK_FAIL_AT=name[:n]: from the n-th pass on, raise ENOSPC here (a full disk)."""
    global _fail_remaining
    if not _fail_name or name != _fail_name:
        return
    _fail_remaining -= 1
    if _fail_remaining <= 0:
        raise OSError(errno.ENOSPC, "No space left on device (FLEETDECK_FAIL_AT)")


def crash_point(name: str) -> None:
    global _remaining
    if not ARMED or name != _name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
