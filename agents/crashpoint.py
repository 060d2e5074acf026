"""Crash points for tests: FLEETDECK_CRASH_AT=name[:n] SIGKILLs this process at the n-th pass.

Names: lines_written (written, not fsynced), lines_fsynced (fsynced, indices not recorded),
batch_close (renamed, directory not fsynced), upload (object put, not yet confirmed).
"""

from __future__ import annotations

import os
import signal

_spec = os.environ.get("FLEETDECK_CRASH_AT", "")
_name, _, _count = _spec.partition(":")
_remaining = int(_count) if _count else 1
ARMED = bool(_name)


def crash_point(name: str) -> None:
    global _remaining
    if not ARMED or name != _name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
