"""The servers' command template: values are quoted, the template is checked at spec load."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

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
    snap = wait_status(run.run_dir, lambda s: s["status"] == "done", 60, "done")
    # The server got the name as one argument, verbatim.
    models = httpx.get(f"{snap['servers'][0]['url']}/v1/models").json()
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
    wait_status(run.run_dir, lambda s: s["status"] == "done", 60, "done")
    script = (run.run_dir / "launch" / "launch_gpu0.sh").read_text()
    assert """--attention-backend '{"a": 1}'""" in script
