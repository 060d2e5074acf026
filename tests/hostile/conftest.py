"""The hostile-input suite's one way to judge a row: run a real CLI on a bad input, then check
the exit code, that the message names the problem, that no traceback reached the user, that
nothing was written outside where it belongs, and that no finished work was lost.

Each `test_*.py` here is a table of rows for one class of input (prompts files, run.toml,
fleet files, control.json, RPC lines, run-dir contents, node answers); a row is one
`pytest.param(..., id=...)`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = {"fleetdeck": "console.cli", "fleetdeck-agent": "agents.cli",
         "fleetdeck-train": "trainer.cli"}


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


def run_cli(program: str, *args: str | os.PathLike[str], cwd: Path | None = None,
            env: dict[str, str] | None = None, timeout: float = 300,
            stdin: bytes | None = None) -> Outcome:
    """Run `fleetdeck`, `fleetdeck-agent` or `fleetdeck-train` as a user would (a fresh
    process, this checkout's code)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", ENTRY[program], *map(str, args)],
                          cwd=cwd, env=full_env, capture_output=True, timeout=timeout,
                          input=stdin)
    return Outcome(proc.returncode, proc.stdout.decode(errors="replace"),
                   proc.stderr.decode(errors="replace"))


def assert_refused(out: Outcome, code: int, names: Sequence[str]) -> None:
    """Exit `code`, every one of `names` in what the user read, and no traceback."""
    assert "Traceback (most recent call last)" not in out.text, out.text
    assert out.code == code, f"exit {out.code}, expected {code}:\n{out.text}"
    for name in names:
        assert name in out.text, f"the message does not name {name!r}:\n{out.text}"


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` (symlinks not followed) with its size and mtime."""
    found: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            found[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return found


def assert_only_changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                        allowed: Iterable[str] = ()) -> None:
    """Nothing under the watched root changed except paths that start with one of `allowed`."""
    allowed = tuple(allowed)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    stray = sorted(k for k in changed if not k.startswith(allowed) or not allowed)
    assert not stray, f"written where it does not belong: {stray}"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A HOME of its own, watched: a hostile input must never write here."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".bashrc").write_text("# the operator's own\n")
    return h
