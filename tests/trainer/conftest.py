"""Fixtures of the trainer tests: the tiny world, built once per session, on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.trainer.tinyworld import World, build_tokenizer, build_world

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> Iterator[None]:
    # The machine is shared and small: one thread per process keeps timings predictable.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="session")
def random_world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """An untaught target (random weights), saved for `from_pretrained`."""
    return build_world(tmp_path_factory.mktemp("random-target"), teach_steps=0)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    """`fleetdeck-train` in this process: exit code, stdout and stderr."""
    from trainer.cli import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                **(env or {})}
    return subprocess.run([str(BIN / "fleetdeck-train"), *args], capture_output=True,
                          text=True, env=full_env, cwd=REPO, timeout=timeout)
