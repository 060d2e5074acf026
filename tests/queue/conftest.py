from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.s3 import S3Server, start_s3


@pytest.fixture(scope="package")
def queue_s3() -> Iterator[S3Server]:
    """One SeaweedFS for the queue's tests; each test works under a prefix of its own."""
    with tempfile.TemporaryDirectory(prefix="fd-q3-") as d:
        s3 = start_s3(Path(d))
        try:
            yield s3
        finally:
            s3.kill()
