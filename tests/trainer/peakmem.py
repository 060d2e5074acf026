"""Peak live tensor bytes of a stretch of code on the CPU, by torch's own accounting
(torch.profiler with profile_memory: the allocator's running total at every allocation and
free), not the process's RSS. Only tensors allocated inside the stretch count (the running
total is taken relative to its value when the stretch began); tensors mapped from a file
(safetensors weights loaded on the CPU) are not allocations and do not count."""

from __future__ import annotations

import gc
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch.profiler import ProfilerActivity, profile


@dataclass
class Peak:
    bytes: int = 0
    # Live at the end (allocated inside and not freed).
    end: int = 0


@contextmanager
def peak_bytes() -> Iterator[Peak]:
    peak = Peak()
    gc.collect()  # the garbage of earlier stretches would be freed inside this one
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield peak
    fd, name = tempfile.mkstemp(suffix=".json", prefix="fd-peakmem-")
    os.close(fd)
    try:
        prof.export_chrome_trace(name)
        with open(name) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(name)
    # (time, running total after the event, bytes of the event: + allocated, - freed)
    marks = sorted((e["ts"], int(e["args"]["Total Allocated"]), int(e["args"]["Bytes"]))
                   for e in events if e.get("name") == "[memory]"
                   and "Total Allocated" in e.get("args", {}))
    if marks:
        start = marks[0][1] - marks[0][2]
        peak.bytes = max(0, max(t for _, t, _ in marks) - start)
        peak.end = marks[-1][1] - start
