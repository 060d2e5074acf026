"""Real servers for the tests: OpenSSH's sshd and SeaweedFS's S3, each started by the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers.s3 import S3Server, running_s3
from tests.servers.sshd import SshServer, running_sshd

pytest_plugins = ["tests.plugins.sims", "tests.plugins.supervised", "tests.plugins.finished_run",
                  "tests.plugins.pilot"]


@pytest.fixture
def sshd() -> Iterator[SshServer]:
    with running_sshd() as server:
        yield server


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server
