"""The servers' command template: values are quoted, the template is checked at spec load."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import httpx
import pytest

from agents.rundir.spec import RunSpec, load_spec
from agents.rundir.template import render
from tests.plugins.supervised import agent, wait_status

EVIL = "$(touch PWNED)`touch PWNED2`;touch PWNED3"


def _spec_with(spec: Path, **servers: object) -> None:
    lines = spec.read_text().splitlines()
    for key, value in servers.items():
        lines = [x for x in lines if not x.startswith(f"{key} =")]
        at = lines.index("[servers]") + 1
        lines.insert(at, f"{key} = {json.dumps(value)}")
    spec.write_text("\n".join(lines) + "\n")


def _planted(root: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files
            if f.startswith("PWNED")]


def test_a_model_name_is_a_value_never_a_command(supervised, tmp_path: Path) -> None:
    run = supervised(1, prompts=20)
    _spec_with(run.spec, model=EVIL)
    r = agent("up", str(run.spec))
    assert r.returncode == 0, r.stderr
    snap = wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "done")
    # The server got the name as one argument, verbatim.
    models = httpx.get(f"{snap['servers'][0]['url']}/v1/models", timeout=60).json()
    assert EVIL in json.dumps(models), models
    assert not _planted(tmp_path) and not _planted(Path.cwd()), _planted(tmp_path)
    assert "PWNED" not in "".join(os.listdir("/tmp"))


def test_json_braces_in_the_command_are_refused_at_load_not_after_up(supervised) -> None:
    run = supervised(1, prompts=20)
    lines = run.spec.read_text().splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith("command ="))
    command = json.loads(lines[i].split("=", 1)[1])
    lines[i] = "command = " + json.dumps(command + """ --attention-backend '{"a": 1}'""")
    run.spec.write_text("\n".join(lines) + "\n")
    r = agent("up", str(run.spec))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "[servers] command" in r.stderr and "{{" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (run.run_dir / "supervisor.pid").exists()
    # Written as the message says, the same command is accepted and the server gets the JSON.
    lines[i] = "command = " + json.dumps(command + """ --attention-backend '{{"a": 1}}'""")
    run.spec.write_text("\n".join(lines) + "\n")
    assert agent("up", str(run.spec)).returncode == 0
    wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "done")
    script = (run.run_dir / "launch" / "launch_gpu0.sh").read_text()
    assert """--attention-backend '{"a": 1}'""" in script


def _loaded(tmp_path: Path, gpus: str, command: str) -> RunSpec:
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    spec = tmp_path / "run.toml"
    spec.write_text(f'[run]\nname = "t"\n[servers]\ngpus = {gpus}\nmodel = "m"\n'
                    f'command = {json.dumps(command)}\n[generate]\nprompts = "p.jsonl"\n')
    return load_spec(spec)


TP = "serve {model} --port {port} --tp {tp} --dp {tp} --base-gpu-id {gpu} --devices {gpus}"


@pytest.mark.parametrize(("gpus", "want"), [
    ("[[0, 1], [2, 3]]", ["--tp 2 --dp 2 --base-gpu-id 0 --devices 0,1",
                          "--tp 2 --dp 2 --base-gpu-id 2 --devices 2,3"]),
    ("[[0]]", ["--tp 1 --dp 1 --base-gpu-id 0 --devices 0"]),  # the real-SGLang check's spec
    ("[4, 5]", ["--tp 1 --dp 1 --base-gpu-id 4 --devices 4",
                "--tp 1 --dp 1 --base-gpu-id 5 --devices 5"]),
    ("[[3, 1, 2], [0]]", ["--tp 3 --dp 3 --base-gpu-id 3 --devices 3,1,2",
                          "--tp 1 --dp 1 --base-gpu-id 0 --devices 0"]),
], ids=["two-groups-of-two", "group-of-one", "flat", "unequal-in-device-order"])
def test_a_group_renders_as_gpus_tp_and_its_first_gpu(tmp_path: Path, gpus: str,
                                                      want: list[str]) -> None:
    spec = _loaded(tmp_path, gpus, TP)
    rendered = [render(spec.servers.command or "", "m", 30000 + i, group)
                for i, group in enumerate(spec.servers.groups)]
    assert rendered == [f"serve m --port {30000 + i} {w}" for i, w in enumerate(want)]
    # Each renders to what a shell splits into the same words: {gpus} is one argument.
    assert shlex.split(rendered[0])[-1] == ",".join(map(str, spec.servers.groups[0]))
