"""Peak live tensor bytes of a stretch of code on the CPU, by torch's own accounting
(torch.profiler with profile_memory: the allocator's running total at every allocation and
free), not the process's RSS. Only tensors allocated inside the stretch count."""

from __future__ import annotations

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
    totals = [(e["ts"], int(e["args"]["Total Allocated"])) for e in events
              if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {})]
    if totals:
        totals.sort()
        peak.bytes = max(0, max(t for _, t in totals))
        peak.end = totals[-1][1]
