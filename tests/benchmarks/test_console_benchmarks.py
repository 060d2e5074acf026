"""The console's benchmarks at a smoke size, each a process of its own, so that none can
silently break (their figures are for the report, not pass/fail)."""

from __future__ import annotations

import pytest

from tests.benchmarks.smoke import ratios, run_bench

NUM = r"(\d+(?:\.\d+)?)"


def test_tui() -> None:
    out = run_bench("tui.py", "--seconds", "2", "--nodes", "4", "--gpus", "2")
    ratios(out, rf"CPU {NUM}x the bare DataTable's; p95 per update {NUM}x, worst bound {NUM}x",
           count=6)


@pytest.mark.parametrize("engine", ["stream", "openssh", "asyncssh"])
def test_pull(engine: str) -> None:
    out = run_bench("pull.py", "--big", "1", "--big-mb", "2", "--small", "20", "--runs", "1",
                    "--engine", engine)
    assert f"fleetdeck pull ({engine}: " in out, out
    ratios(out, rf"ratio pull/(?:scp|scp-gcm|rsync|rsync-fsync): {NUM}x throughput", count=4)
