"""Run a benchmark script as the user does (`python benchmarks/X.py ...`, a process of its own)
at a smoke size, and read the ratios it prints. Only that it ran and printed sane ratios is
checked: the figures themselves, at this size and on a shared machine, mean nothing."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # a loaded machine is slow; a hung benchmark still fails


def run_bench(script: str, *args: str) -> str:
    """Its stdout; fails with its output when it exits non-zero."""
    t = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    took = time.monotonic() - t
    assert proc.returncode == 0, (f"benchmarks/{script} {' '.join(args)} exited "
                                  f"{proc.returncode} after {took:.0f} s:\n"
                                  f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    print(f"benchmarks/{script}: {took:.1f} s")
    return proc.stdout


def ratios(out: str, pattern: str, count: int = 1, positive: bool = True) -> list[float]:
    """The numbers `pattern`'s groups match in `out`, at least `count` of them, each finite
    (and > 0 unless `positive` is False)."""
    found = [float(m) for hit in re.findall(pattern, out)
             for m in (hit if isinstance(hit, tuple) else (hit,))]
    assert len(found) >= count, f"{count} x {pattern!r} wanted, {len(found)} in:\n{out}"
    for value in found:
        assert math.isfinite(value) and (value > 0 if positive else value >= 0), \
            f"{pattern!r}: {value} in:\n{out}"
    return found
