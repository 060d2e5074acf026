"""Where a run's control socket lives. sun_path holds 107 bytes, and run directories can be
deep, so the socket sits in a short per-user folder and RUN_DIR/agent.sock.path points to it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def socket_path(run_dir: Path) -> Path:
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    folder = Path(f"/tmp/fleetdeck-{os.getuid()}")
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder / f"{digest}.sock"


def recorded_socket(run_dir: Path) -> Path | None:
    try:
        return Path((run_dir / "agent.sock.path").read_text().strip())
    except FileNotFoundError:
        return None
