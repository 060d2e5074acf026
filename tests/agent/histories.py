"""Synthetic history.jsonl files, written fast with synthetic timestamps: a 20-hour run is
7,200 samples in a fraction of a second. Each sample is a progress.json dict as the engine
records it (tests/agent/test_histstore.py, tests/agent/test_accept_drift.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEP_S = 10.0


def sample(i: int, t: float, servers: int = 2,
           accept: Callable[[int, float], float | None] = lambda n, t: 3.0) -> dict[str, Any]:
    """Sample number i at time t: tok/s = i (+ 1000 per server), completed = 3 i, in flight
    cycling 0..6: means, last values and maxima are easy to check."""
    rows = {str(n): {"url": f"http://127.0.0.1:{30000 + n}", "state": "healthy",
                     "in_flight": (i + n) % 7, "limit": 8, "completed": i + n, "failed": 0,
                     "req_per_s": 1.0, "tok_per_s": float(i + 1000 * n),
                     "accept_length": accept(n, t)}
            for n in range(servers)}
    return {"total": 10**6, "completed": 3 * i, "failed": i // 100, "rate_per_sec": float(i),
            "eta_hours": 1.0, "total_input_tokens": 0, "total_output_tokens": 50 * i,
            "avg_output_tokens": 50.0, "elapsed_hours": 0.0, "s3_uploaded": 0, "s3_bytes": 0,
            "status": "running", "truncated": 0, "empty": 0, "max_tokens": 256,
            "concurrency": 8, "in_flight": i % 7, "retried": 0, "s3_pending": 0,
            "control_rev": 1, "updated_at": t, "servers": rows}


def write_history(path: Path, start: float, count: int, first: int = 0, servers: int = 2,
                  accept: Callable[[int, float], float | None] = lambda n, t: 3.0) -> list[
                      dict[str, Any]]:
    """Append `count` samples 10 s apart from `start` (numbered from `first`); the samples."""
    out = [sample(first + k, start + (first + k) * STEP_S, servers, accept)
           for k in range(count)]
    with open(path, "a") as f:
        f.write("".join(json.dumps(s) + "\n" for s in out))
    return out
