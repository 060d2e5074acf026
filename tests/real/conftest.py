"""The real-server tier: SGLang 0.5.23 itself, on the CPU, serving a tiny random Qwen3.

`make test` runs this folder as its own serial phase after the main suite, with
FLEETDECK_REAL_TIER=required: the environment is built if absent (tests/real/env.py) and a
missing or broken one fails every test here, saying why. A plain `pytest` run uses the
environment when a build left one and otherwise skips the tier, saying how to get it. Under
xdist it never runs: SGLang on two cores would starve the other workers' timing tests.

Servers are costly (a start-up is about a minute here), so they are shared per session: one
default server and one with a small KV pool, each started on first use. Tests on a shared
server read its counters before and after, one test at a time, and leave it idle.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real.env import EnvError, RealEnv, build, cache_root, find
from tests.real.server import RealServer, start_server

REQUIRED = os.environ.get("FLEETDECK_REAL_TIER") == "required"
# A KV pool this small holds ~10 answers of 256 tokens. Sixteen in flight queue; they retract
# only when some could end early (SGLang reserves an ignore_eos request in full and never
# retracts it) and its new-token ratio has fallen, so a test that needs retractions checks the
# server's own counter (num_retracted_requests_total) rather than assuming them.
SMALL_KV_TOKENS = 3072


@pytest.fixture(scope="session")
def real_env() -> RealEnv:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        msg = "the real-server tier runs serially (make test's second phase), not under xdist"
        if REQUIRED:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    if not REQUIRED:
        env = find()
        if env is None:
            pytest.skip(f"real-server tier: no environment under {cache_root()}; "
                        "`make test` builds it, or `python -m tests.real.env build`")
        return env
    try:
        return build()
    except EnvError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(autouse=True)
def _tier(real_env: RealEnv) -> RealEnv:
    return real_env


@pytest.fixture(scope="session")
def real_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fd-real-") as d:
        yield Path(d)


def _shared(env: RealEnv, folder: Path, **kw: int) -> Iterator[RealServer]:
    server = start_server(env, folder, **kw)
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def default_server(real_env: RealEnv, real_root: Path) -> Iterator[RealServer]:
    """The tier's shared server: KV room for far more than any test sends at once."""
    yield from _shared(real_env, real_root / "default", max_total_tokens=65536)


@pytest.fixture(scope="session")
def small_kv_server(real_env: RealEnv, real_root: Path) -> Iterator[RealServer]:
    """A server whose KV pool is full at a few requests: it queues, and can retract."""
    yield from _shared(real_env, real_root / "small-kv", max_total_tokens=SMALL_KV_TOKENS)


@pytest.fixture
def server(default_server: RealServer) -> Iterator[RealServer]:
    """The default server, idle before and after the test."""
    default_server.wait_idle()
    yield default_server
    default_server.wait_idle()
