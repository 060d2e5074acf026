"""Hostile or broken run-directory contents (symlinks, FIFOs, a directory where a file should
be, a huge file, a socket pointer to someone else's socket, the secrets file) read by the real
`fleetdeck-agent` verbs. Each row: no freeze, the exit code, the message naming the problem,
nothing read from outside the run directory, nothing written, no finished work lost."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agent.rundirs import copy_run, finished_run, finished_work
from tests.hostile.conftest import assert_only_changed, assert_refused, run_cli, tree

SECRET = "OUTSIDE-SECRET-7d1f"


@dataclass
class Place:
    run: Path
    outside: Path


def _outside_batch(p: Place) -> Path:
    path = p.outside / "completions_000009.jsonl"
    path.write_text(json.dumps({"index": 7, "finish_reason": "stop", "content": SECRET,
                                "usage": {}}) + "\n")
    return path


def fifo_log(p: Place) -> None:
    os.mkfifo(p.run / "logs" / "x.log")


def symlink_log(p: Place) -> None:
    (p.outside / "secret.log").write_text(f"{SECRET}\n")
    (p.run / "logs" / "escape.log").symlink_to(p.outside / "secret.log")


def logs_folder_symlink(p: Place) -> None:
    (p.outside / "generate.log").write_text(f"{SECRET}\n")
    (p.run / "logs").rename(p.run / "logs.real")
    (p.run / "logs").symlink_to(p.outside)


def log_is_a_folder(p: Place) -> None:
    (p.run / "logs" / "generate.log").unlink()
    (p.run / "logs" / "generate.log").mkdir()


def huge_sparse_log(p: Place) -> None:
    with open(p.run / "logs" / "big.log", "wb") as f:
        f.truncate(2 * 1024**3)
        f.seek(0, 2)
        f.write(b"\nthe last line\n")


def symlinked_batch(p: Place) -> None:
    (p.run / "completions" / "completions_000009.jsonl").symlink_to(_outside_batch(p))


def completions_folder_symlink(p: Place) -> None:
    _outside_batch(p)
    (p.run / "completions").rename(p.run / "completions.real")
    (p.run / "completions").symlink_to(p.outside)


def fifo_open_batch(p: Place) -> None:
    os.mkfifo(p.run / "completions" / "completions_000009.jsonl.partial")


def history_symlink(p: Place) -> None:
    (p.outside / "history.jsonl").write_text(json.dumps({"updated_at": 9e9, "x": SECRET}) + "\n")
    (p.run / "history.jsonl").unlink()
    (p.run / "history.jsonl").symlink_to(p.outside / "history.jsonl")


def history_fifo(p: Place) -> None:
    (p.run / "history.jsonl").unlink()
    os.mkfifo(p.run / "history.jsonl")


def history_bad_lines(p: Place) -> None:
    (p.run / "history.jsonl").write_text(
        '{"updated_at": 1}\n5\n"text"\nnull\n{"updated_at": "soon"}\n' + "[" * 9000 + "\n"
        + '{"updated_at": 2}\n')


def run_toml_fifo(p: Place) -> None:
    (p.run / "run.toml").unlink()
    os.mkfifo(p.run / "run.toml")


def secrets_file(p: Place) -> None:
    fd = os.open(p.run / "secrets.json", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps({"servers": {"api_key": SECRET}}).encode())
    os.close(fd)


HISTORY_IN = b'{"jsonrpc": "2.0", "id": 1, "method": "history"}\n'

# (spoil, argv after the run dir is known, stdin, exit code, names in the output)
ROWS = [
    pytest.param(fifo_log, ["logs", "{run}", "x"], None, 2, ["not a regular file"],
                 id="log-fifo"),
    pytest.param(symlink_log, ["logs", "{run}", "escape"], None, 2, ["symbolic link"],
                 id="log-symlink-out"),
    pytest.param(logs_folder_symlink, ["logs", "{run}", "generate"], None, 2,
                 ["symbolic link"], id="logs-folder-symlink"),
    pytest.param(log_is_a_folder, ["logs", "{run}", "generate"], None, 2,
                 ["not a regular file"], id="log-is-a-folder"),
    pytest.param(None, ["logs", "{run}", "../run.toml"], None, 2, ["'..'"],
                 id="log-name-is-a-path"),
    pytest.param(huge_sparse_log, ["logs", "{run}", "big", "-n", "1"], None, 0,
                 ["the last line"], id="log-2-GiB"),
    pytest.param(symlinked_batch, ["samples", "{run}", "--json", "-n", "50"], None, 0,
                 ['"samples"'], id="batch-symlink-out"),
    pytest.param(completions_folder_symlink, ["samples", "{run}", "--json"], None, 0,
                 ['{"samples": []}'], id="completions-folder-symlink"),
    pytest.param(fifo_open_batch, ["samples", "{run}", "--json", "-n", "3"], None, 0,
                 ['"samples"'], id="open-batch-fifo"),
    pytest.param(history_symlink, ["serve", "{run}", "--stdio"], HISTORY_IN, 0,
                 ["symbolic link"], id="history-symlink-out"),
    pytest.param(history_fifo, ["serve", "{run}", "--stdio"], HISTORY_IN, 0,
                 ["not a regular file"], id="history-fifo"),
    pytest.param(history_bad_lines, ["serve", "{run}", "--stdio"], HISTORY_IN, 0,
                 ['"bad_lines":5'], id="history-bad-lines"),
    pytest.param(run_toml_fifo, ["status", "{run}", "--json"], None, 0, ['"source":"disk"'],
                 id="run-toml-fifo"),
    pytest.param(secrets_file, ["manifest", "{run}", "--json"], None, 0, ['"run.toml"'],
                 id="secrets-not-in-manifest"),
]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_run(tmp_path_factory.mktemp("made"))


@pytest.mark.parametrize(("spoil", "argv", "stdin", "code", "names"), ROWS)
def test_hostile_run_dir_contents(made: Path, tmp_path: Path, home: Path,
                                  spoil: Callable[[Place], None] | None, argv: list[str],
                                  stdin: bytes | None, code: int, names: list[str]) -> None:
    place = Place(copy_run(made, tmp_path / "run"), tmp_path / "outside")
    place.outside.mkdir()
    if spoil is not None:
        spoil(place)
    work = finished_work(place.run) if (place.run / "completions").is_dir() else None
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", *[a.format(run=place.run) for a in argv], stdin=stdin,
                  env={"HOME": str(home)}, timeout=180)  # a freeze fails the row here
    assert_refused(out, code, names)
    assert SECRET not in out.text, "something from outside the run dir was served"
    assert len(out.stdout) < 6 * 1024 * 1024
    assert_only_changed(before, tree(tmp_path), allowed=["run/.manifest_cache.json"])
    if work is not None:
        assert finished_work(place.run) == work
    if argv[0] == "manifest":
        assert "secrets.json" not in out.text


def test_agent_sock_path_pointing_at_someone_elses_socket(made: Path, tmp_path: Path,
                                                          home: Path) -> None:
    run = copy_run(made, tmp_path / "run")
    with tempfile.TemporaryDirectory(prefix="fd-foreign-") as d:
        trap = Path(d) / "trap.sock"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(trap))
        listener.listen()
        listener.setblocking(False)
        (run / "agent.sock.path").write_text(f"{trap}\n")
        (run / "supervisor.pid").write_text(f"{os.getpid()}\n")  # a live pid, not ours
        before = tree(tmp_path)
        try:
            out = run_cli("fleetdeck-agent", "status", run, "--json", env={"HOME": str(home)},
                          timeout=180)
            assert_refused(out, 0, ['"source":"disk"'])
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody knocked
        finally:
            listener.close()
        assert_only_changed(before, tree(tmp_path))
