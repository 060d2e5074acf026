from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.s3 import S3Server, running_s3


@pytest.fixture(scope="package")
def queue_s3() -> Iterator[S3Server]:
    """One SeaweedFS for the queue's tests; each test works under a prefix of its own."""
    with running_s3() as s3:
        yield s3
