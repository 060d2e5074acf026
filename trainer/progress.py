"""progress.json for a training run, in the fleet's conventions (`kind = "train"`).

Written atomically (temp + os.replace) by rank 0 (with several nodes, by each node's first
process: node 0's is the run's progress, the others' say "rank R of N, following rank 0"
and count the same steps): on every update at most every `every_s`
seconds, always at a checkpoint and at the end, and by a heartbeat thread in between, so
that `updated_at` stays fresh through a long step, evaluation or checkpoint and the agent
and console read it like a generation run's heartbeat (agents.rundir.schema.TrainProgress).
The forced writes (the start, each checkpoint, the end) are fsynced, the heartbeat's are not:
after a power loss the file is there, whole and at least as new as the last checkpoint, so
the supervisor's resume passes `--resume` to a run that has checkpoints.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.atomic import atomic_write, make_dirs
from agents.rundir.schema import RunStatus, TrainProgress, encoder


class ProgressWriter:
    def __init__(self, path: Path, run: str, total_steps: int, epochs: int, world: int,
                 every_s: float = 2.0, node_rank: int = 0, nodes: int = 1) -> None:
        self.path = path
        self.every_s = every_s
        self.started_at = time.time()
        self._last = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        make_dirs(path.parent)
        self.state = TrainProgress(
            step=0, total_steps=total_steps, epoch=0, loss=None, accuracy=[],
            accept_length=None, tokens_per_s=0.0, lr=0.0, eta_hours=None,
            last_checkpoint=None, best_checkpoint=None, status="starting",
            updated_at=self.started_at, run=run, pid=os.getpid(),
            started_at=self.started_at, epochs=epochs, world_size=world,
            node_rank=node_rank, nodes=nodes)

    def update(self, force: bool = False, **fields: Any) -> None:
        with self._lock:
            for key, value in fields.items():
                if isinstance(value, float) and not math.isfinite(value):
                    value = None  # JSON has no NaN; unknown is null
                setattr(self.state, key, value)
            if force or time.time() - self._last >= self.every_s:
                self._write(durable=force)

    def _write(self, durable: bool = False) -> None:
        now = time.time()
        self.state.updated_at = now
        self.state.elapsed_hours = (now - self.started_at) / 3600.0
        # The heartbeat is not fsynced (rewritten every few seconds; the rename keeps it whole).
        atomic_write(self.path, encoder.encode(self.state), durable=durable)
        self._last = now

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.every_s):
                with self._lock:
                    if time.time() - self._last >= self.every_s:
                        self._write()

        self._beat = threading.Thread(target=beat, name="progress-heartbeat", daemon=True)
        self._beat.start()

    def finish(self, status: RunStatus, message: str | None = None) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        self.update(force=True, status=status, message=message)


def read_progress(path: Path) -> TrainProgress:
    return msgspec.json.decode(path.read_bytes(), type=TrainProgress)
