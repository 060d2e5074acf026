"""Hostile run.toml on the node: what reaches a shell or a process environment (the servers'
command template, env keys and values, the model name) and where secrets are kept. Each row
drives the real `fleetdeck-agent` and must be refused at load, naming the key, with nothing
started, nothing written outside the run directory and the finished run's work intact."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.rundirs import copy_run, finished_run, finished_work
from tests.hostile.conftest import assert_only_changed, assert_refused, run_cli, tree

GOOD_COMMAND = f"{sys.executable} -m agents.sim --port {{port}} --model-path {{model}}"


def _spec(root: Path, run_dir: Path, servers: dict[str, Any] | None = None,
          extra: str = "") -> Path:
    """A gpus spec (servers launched by the supervisor) whose run dir is a finished run."""
    s: dict[str, Any] = {"gpus": [0], "base_port": 39000, "model": "qwen-sim",
                         "command": GOOD_COMMAND}
    s.update(servers or {})
    lines = ["[run]", 'name = "hostile"', f"dir = {json.dumps(str(run_dir))}", "", "[servers]"]
    for k, v in s.items():
        if isinstance(v, dict):
            inner = ", ".join(f"{json.dumps(a)} = {json.dumps(b)}" for a, b in v.items())
            lines.append(f"{k} = {{ {inner} }}")
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    lines += [extra, "", "[generate]", f"prompts = {json.dumps(str(root / 'prompts.jsonl'))}"]
    prompts = root / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    path = root / "spec" / "run.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_run(tmp_path_factory.mktemp("made"))


# (servers overrides, what the message must name)
UP_ROWS = [
    pytest.param({"env": {"A;touch PWNED;B": "x"}}, ["[servers] env", "A;touch PWNED;B"],
                 id="env-key-shell"),
    pytest.param({"env": {"MY-VAR": "x"}}, ["[servers] env", "MY-VAR", "not an environment"],
                 id="env-key-dash"),
    pytest.param({"env": {"1ABC": "x"}}, ["[servers] env", "1ABC"], id="env-key-digit"),
    pytest.param({"env": {"OK": "a\u0000b"}}, ["[servers] env OK", "NUL"], id="env-value-nul"),
    pytest.param({"model": "qwen\u0000; rm -rf /"}, ["[servers] model", "NUL"], id="model-nul"),
    pytest.param({"command": GOOD_COMMAND + """ --json '{"a": 1}'"""},
                 ["[servers] command", "{{"], id="command-json-braces"),
    pytest.param({"command": GOOD_COMMAND + " --host {host}"},
                 ["[servers] command", "{host}"], id="command-unknown-field"),
    pytest.param({"command": GOOD_COMMAND + ' --served-model-name "{model}"'},
                 ["[servers] command", "inside quotes"], id="command-double-quoted"),
    pytest.param({"command": GOOD_COMMAND + " --served-model-name '{model}'"},
                 ["[servers] command", "inside quotes"], id="command-single-quoted"),
    pytest.param({"command": GOOD_COMMAND + " --x {model.__class__}"},
                 ["[servers] command", "model.__class__"], id="command-attribute"),
    pytest.param({"command": GOOD_COMMAND + " --x {port:05d}"},
                 ["[servers] command", "format spec"], id="command-format-spec"),
    pytest.param({"command": GOOD_COMMAND + " --x {}"},
                 ["[servers] command", "{}"], id="command-positional"),
    pytest.param({"command": GOOD_COMMAND + " }"},
                 ["[servers] command", "{{"], id="command-lone-brace"),
    pytest.param({"env": {"PLAIN": "x"}, "secret_env": ["NOT_THERE"]},
                 ["[servers] secret_env", "NOT_THERE"], id="secret-env-unknown"),
    # GPU groups (servers that span GPUs): each GPU belongs to one server, once.
    pytest.param({"gpus": [[0, 1], []]}, ["[servers] gpus[1]", "empty group"],
                 id="gpus-empty-group"),
    pytest.param({"gpus": [[0, 1], [1, 2]]}, ["[servers] gpus[1][0]", "GPU 1", "twice"],
                 id="gpus-one-gpu-in-two-groups"),
    pytest.param({"gpus": [[0, 0]]}, ["[servers] gpus[0][1]", "GPU 0", "twice"],
                 id="gpus-duplicate-in-a-group"),
    pytest.param({"gpus": [0, 1, 0]}, ["[servers] gpus[2]", "GPU 0", "twice"],
                 id="gpus-duplicate-flat"),
    pytest.param({"gpus": [[0, 1], 2]}, ["[servers] gpus[1]", "mixes GPU ids and groups"],
                 id="gpus-mixed-ids-and-groups"),
    pytest.param({"gpus": [[0, -1]]}, ["[servers] gpus[0][1]", "negative"],
                 id="gpus-negative-in-a-group"),
    pytest.param({"gpus": [[[0]]]}, ["[servers] gpus[0][0]", "Expected `int`"],
                 id="gpus-nested-too-deep"),
    pytest.param({"gpus": [["0", "1"]]}, ["[servers] gpus[0][0]", "str"],
                 id="gpus-ids-as-strings"),
    pytest.param({"command": GOOD_COMMAND + " --tp {tp_size}"},
                 ["[servers] command", "{tp_size}", "{tp}"], id="command-unknown-tp-field"),
    pytest.param({"command": GOOD_COMMAND + ' --tp "{tp}"'},
                 ["[servers] command", "{tp}", "inside quotes"], id="command-tp-quoted"),
]


@pytest.mark.parametrize(("servers", "names"), UP_ROWS)
def test_up_refuses_at_load(made: Path, tmp_path: Path, home: Path,
                            servers: dict[str, Any], names: list[str]) -> None:
    run_dir = copy_run(made, tmp_path / "run")
    work = finished_work(run_dir)
    spec = _spec(tmp_path, run_dir, servers)
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "up", spec, cwd=tmp_path, env={"HOME": str(home)})
    assert_refused(out, 2, names)
    assert_only_changed(before, tree(tmp_path))
    assert finished_work(run_dir) == work
    assert not (run_dir / "supervisor.pid").exists()
    assert not list(tmp_path.rglob("PWNED*"))


def test_secrets_in_a_spec_that_lies_in_its_own_run_dir(made: Path, tmp_path: Path,
                                                        home: Path) -> None:
    run_dir = copy_run(made, tmp_path / "run")
    work = finished_work(run_dir)
    spec = _spec(tmp_path, run_dir, {"api_key": "sk-VERY-SECRET", "env": {"HF_TOKEN": "hf_X1"}})
    text = spec.read_text().replace(f"dir = {json.dumps(str(run_dir))}\n", "")
    (run_dir / "run.toml").write_text(text)  # the user's own file, in the run dir
    (run_dir / "run.base").unlink()
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "up", run_dir / "run.toml", env={"HOME": str(home)})
    assert_refused(out, 2, ["api_key", "env HF_TOKEN", "[run] dir"])
    assert "sk-VERY-SECRET" not in out.text and "hf_X1" not in out.text
    assert_only_changed(before, tree(tmp_path))
    assert finished_work(run_dir) == work


def _kept_with_secrets(made: Path, tmp_path: Path) -> Path:
    """A finished run whose run.toml copy was kept with secrets apart (as `up` keeps it)."""
    from agents.rundir.spec import keep_copy, load_spec

    run_dir = copy_run(made, tmp_path / "run")
    spec_path = tmp_path / "orig" / "run.toml"
    spec_path.parent.mkdir()
    text = (made.parent / "run.toml").read_text().replace(
        "[servers]\n", '[servers]\napi_key = "sk-KEPT-APART"\nenv = { HF_TOKEN = "hf_APART" }\n')
    text = text.replace(f'dir = "{made}"', f'dir = "{run_dir}"')
    spec_path.write_text(text)
    keep_copy(load_spec(spec_path), run_dir)
    assert "sk-KEPT-APART" not in (run_dir / "run.toml").read_text()
    return run_dir


def _loosen(run_dir: Path) -> None:
    os.chmod(run_dir / "secrets.json", 0o644)


def _link(run_dir: Path) -> None:
    target = run_dir.parent / "elsewhere.json"
    (run_dir / "secrets.json").rename(target)
    (run_dir / "secrets.json").symlink_to(target)


def _lose(run_dir: Path) -> None:
    (run_dir / "secrets.json").unlink()


def _fifo_spec(run_dir: Path) -> None:
    (run_dir / "run.toml").unlink()
    os.mkfifo(run_dir / "run.toml")


RESUME_ROWS = [
    pytest.param(_loosen, ["secrets.json", "0644"], id="secrets-readable-by-others"),
    pytest.param(_link, ["secrets.json", "symbolic link"], id="secrets-symlink"),
    pytest.param(_lose, ["secrets.json", "missing", "api_key", "env HF_TOKEN"],
                 id="secrets-missing"),
    pytest.param(_fifo_spec, ["run.toml", "not a regular file"], id="run-toml-fifo"),
]


@pytest.mark.parametrize(("spoil", "names"), RESUME_ROWS)
def test_resume_refuses_a_spoiled_run_dir(made: Path, tmp_path: Path, home: Path,
                                          spoil: Callable[[Path], None],
                                          names: list[str]) -> None:
    run_dir = _kept_with_secrets(made, tmp_path)
    work = finished_work(run_dir)
    spoil(run_dir)
    before = tree(tmp_path)
    out = run_cli("fleetdeck-agent", "resume", run_dir, env={"HOME": str(home)}, timeout=180)
    assert_refused(out, 2, names)
    assert "sk-KEPT-APART" not in out.text and "hf_APART" not in out.text
    assert_only_changed(before, tree(tmp_path))
    assert finished_work(run_dir) == work
    assert not (run_dir / "supervisor.pid").exists()
