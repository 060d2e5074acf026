"""Re-exported for tests: the product's local SeaweedFS S3 server, and `running_s3`, the one
way a fixture starts one (in a fresh short folder, killed at the end)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from console.seaweed import S3Server, WeedMissing, start_s3, weed_binary


@contextmanager
def running_s3() -> Iterator[S3Server]:
    with tempfile.TemporaryDirectory(prefix="fd-s3-") as d:
        server = start_s3(Path(d))
        try:
            yield server
        finally:
            server.kill()


__all__ = ["S3Server", "WeedMissing", "running_s3", "start_s3", "weed_binary"]
