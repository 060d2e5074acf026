"""Simulators for the simulator's own tests: real subprocesses on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.simserver import FAST_ARGS, SimHandle, start_sim


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    """One fast simulator with metrics, shared by a module's tests."""
    handle = start_sim(tmp_path_factory.mktemp("sim"), *FAST_ARGS, "--enable-metrics",
                       "--served-model-name", "qwen3-mtp", "--speculative-algorithm", "NEXTN")
    try:
        yield handle
    finally:
        handle.kill()
