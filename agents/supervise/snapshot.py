"""The status snapshot, built from a live supervisor or from the run directory alone.

Node facts flow one way: servers, engine and disk -> this snapshot -> protocol -> console.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from agents import __version__
from agents.rundir.browse import read_regular
from agents.rundir.schema import (
    DiskStatus,
    GpuStats,
    Progress,
    ServerProgress,
    ServerState,
    ServerStatus,
    Snapshot,
    TrainProgress,
    progress_decoder,
    train_progress_decoder,
)
from agents.supervise.procinfo import alive


class DiskWatch:
    """Free space of RUN_DIR's file system and time to full at the recent rate."""

    def __init__(self, path: Path, window_s: float = 600.0, min_span_s: float = 300.0) -> None:
        self.path = path
        self.window_s = window_s
        # A projection from less than a few minutes of samples follows every burst of writes
        # (a pip install beside the run) and cries wolf.
        self.min_span_s = min_span_s
        self._samples: deque[tuple[float, int]] = deque()

    def status(self, now: float | None = None) -> DiskStatus | None:
        now = time.time() if now is None else now
        try:
            usage = shutil.disk_usage(self.path)
        except OSError:
            return None
        self._samples.append((now, usage.free))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        hours = None
        t0, free0 = self._samples[0]
        if now - t0 >= self.min_span_s and free0 > usage.free:
            rate = (free0 - usage.free) / (now - t0)
            hours = usage.free / rate / 3600
        return DiskStatus(path=str(self.path), free_bytes=usage.free, total_bytes=usage.total,
                          hours_to_full=round(hours, 2) if hours is not None else None)


class Nvml:
    """GPU figures from NVML when the library is there; None otherwise (never zeros). A server
    on several GPUs gets the group's figures as one (group_stats)."""

    def __init__(self, ttl_s: float = 2.0) -> None:
        self.ttl_s = ttl_s
        self._cache: tuple[float, dict[int, GpuStats]] | None = None
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def stats(self, group: list[int]) -> GpuStats | None:
        """The figures of a server's GPUs together; None without NVML or when one of them
        could not be read (a sum over part of a group would pass for the whole)."""
        if self._nvml is None:
            return None
        now = time.monotonic()
        if self._cache is None or now - self._cache[0] > self.ttl_s:
            self._cache = (now, self._read_all())
        read = [self._cache[1].get(gpu) for gpu in group]
        if not read or any(g is None for g in read):
            return None
        return group_stats([g for g in read if g is not None])

    def _read_all(self) -> dict[int, GpuStats]:
        n = self._nvml
        out: dict[int, GpuStats] = {}
        try:
            count = n.nvmlDeviceGetCount()
        except Exception:
            return out
        for i in range(count):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                util = n.nvmlDeviceGetUtilizationRates(h)
                mem = n.nvmlDeviceGetMemoryInfo(h)
                out[i] = GpuStats(
                    util_pct=float(util.gpu), mem_used_mib=mem.used / 2**20,
                    mem_total_mib=mem.total / 2**20,
                    temp_c=float(n.nvmlDeviceGetTemperature(h, 0)),
                    power_w=n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                )
            except Exception:
                continue
        return out


def group_stats(each: list[GpuStats]) -> GpuStats:
    """One server's GPUs as one: memory used and total summed (what the server holds), power
    summed (what it draws), utilisation the mean (the GPUs of a TP group work in step, so
    the mean is how busy the server is; a straggler shows in its own nvidia-smi), the
    temperature the hottest (the one that throttles). A field unknown on any GPU is
    unknown for the group."""
    def known(field: str) -> list[float] | None:
        values = [getattr(g, field) for g in each]
        return None if any(v is None for v in values) else values

    util, used, total = known("util_pct"), known("mem_used_mib"), known("mem_total_mib")
    temp, power = known("temp_c"), known("power_w")
    return GpuStats(
        util_pct=sum(util) / len(util) if util else None,
        mem_used_mib=sum(used) if used else None, mem_total_mib=sum(total) if total else None,
        temp_c=max(temp) if temp else None, power_w=sum(power) if power else None)


def read_progress(run_dir: Path) -> tuple[Progress | None, float | None]:
    try:
        raw = read_regular(run_dir / "progress.json")
        p = progress_decoder.decode(raw)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        # Missing, a FIFO, a folder, a symlink or torn: no progress (never a hang or a crash).
        return None, None
    return p, max(0.0, time.time() - p.updated_at)


def read_train_progress(run_dir: Path) -> TrainProgress | None:
    """The trainer's progress.json, typed; None when it is missing, unreadable or not a
    training run's (a half-written or foreign file is no progress)."""
    try:
        return train_progress_decoder.decode(read_regular(run_dir / "progress.json"))
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def server_row(number: int, sp: ServerProgress | None, url: str | None = None,
               state: ServerState | None = None) -> ServerStatus:
    """A server's status row from what the engine counted (progress.json's `servers`); the
    supervisor overlays what it watches itself (state, pid, SGLang's own figures)."""
    st = ServerStatus(number=number, url=url if url is not None else (sp.url if sp else ""),
                      state=state or (sp.state if sp else "down"))
    if sp is not None:
        st.in_flight, st.limit, st.completed, st.failed = (sp.in_flight, sp.limit,
                                                           sp.completed, sp.failed)
        st.req_per_s, st.tok_per_s, st.accept_length = (sp.req_per_s, sp.tok_per_s,
                                                         sp.accept_length)
        st.last_error = sp.last_error
    return st


def servers_from_progress(progress: Progress | None) -> list[ServerStatus]:
    if progress is None:
        return []
    return [server_row(int(name), sp)
            for name, sp in sorted(progress.servers.items(), key=lambda kv: int(kv[0]))]


def supervisor_pid(run_dir: Path) -> int | None:
    try:
        pid = int((run_dir / "supervisor.pid").read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def from_disk(run_dir: Path, kind: str = "generate", name: str = "") -> Snapshot:
    """What the files say when no supervisor answers (status keeps its last word, aged)."""
    progress, age = read_progress(run_dir) if kind == "generate" else (None, None)
    train = read_train_progress(run_dir) if kind == "train" else None
    status = progress.status if progress else (train.status if train else "unknown")
    if progress is not None and progress.pid and status in ("running", "paused", "draining") \
            and not alive(progress.pid):
        status = "failed"  # the engine died without writing its last status
    disk = DiskWatch(run_dir).status()
    return Snapshot(
        kind=kind,  # type: ignore[arg-type]
        run=name or (progress.run if progress else run_dir.name), run_dir=str(run_dir),
        host=socket.gethostname(), status=status, updated_at=time.time(), source="disk",
        agent_version=__version__, supervisor_pid=supervisor_pid(run_dir), progress=progress,
        progress_age_s=round(age, 1) if age is not None else None, train=train,
        servers=servers_from_progress(progress), disk=disk,
        message="no supervisor is running: figures are from the run directory"
        if supervisor_pid(run_dir) is None else None,
    )


__all__ = ["DiskWatch", "Nvml", "from_disk", "group_stats", "read_progress", "supervisor_pid"]
