"""The training job as the supervisor stops it: `fleetdeck-train train`, which is torchrun
itself when the run has several processes or nodes (trainer/launch.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def is_torchrun(pid: int) -> bool:
    try:
        return b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (torchrun starts its workers in sessions of their
    own, so its process group does not hold them)."""
    out = []
    for entry in os.listdir("/proc"):
        if not (entry.isascii() and entry.isdigit()):
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(pid).encode():
            out.append(int(entry))
    return out


def ask_to_stop(pid: int) -> None:
    """SIGTERM to what stops at the end of its step, with a checkpoint: the trainer, or under
    torchrun its workers. torchrun then ends by itself, through its exit barrier with the
    other nodes' torchrun; a SIGTERM to torchrun itself would end it without that barrier and
    leave the other nodes' torchrun waiting minutes for it after their workers stopped too."""
    targets = children(pid) if is_torchrun(pid) else []
    for target in targets or [pid]:
        try:
            os.kill(target, signal.SIGTERM)
        except ProcessLookupError:
            pass
