"""`sims`: simulated SGLang servers as real processes, started on demand by a test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers.ports import kill_pid
from tests.simserver import SimHandle, start_sim

# Fast simulated time: a 256-token answer takes milliseconds, not seconds.
FAST = ("--time-scale", "0.01", "--load-seconds", "0")


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[Callable[..., SimHandle]]:
    started: list[SimHandle] = []

    def start(*args: Any) -> SimHandle:
        folder = tmp_path / f"sim{len(started)}"
        folder.mkdir()
        handle = start_sim(folder, *FAST, *[str(a) for a in args])
        started.append(handle)
        return handle

    yield start
    for h in started:
        kill_pid(h.proc)
