"""Real servers for the tests: OpenSSH's sshd and SeaweedFS's S3, each started by the test."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.s3 import S3Server, running_s3
from tests.servers.sshd import SshServer, start_sshd

pytest_plugins = ["tests.plugins.sims", "tests.plugins.supervised", "tests.plugins.finished_run",
                  "tests.plugins.pilot"]


@pytest.fixture
def sshd() -> Iterator[SshServer]:
    # A short path of its own: sshd and Unix sockets dislike long ones.
    with tempfile.TemporaryDirectory(prefix="fd-sshd-") as d:
        server = start_sshd(Path(d))
        try:
            yield server
        finally:
            server.kill()


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server
