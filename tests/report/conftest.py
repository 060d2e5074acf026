from __future__ import annotations

from pathlib import Path

import pytest

from tests.report.runs import recorded_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run's directory (the real engine over two simulators), made once a file."""
    return recorded_run(tmp_path_factory.mktemp("recorded"))
