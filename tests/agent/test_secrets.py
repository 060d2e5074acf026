"""Secrets never reach a launch script, the run.toml copy, a log, control.log, status, an RPC
answer or the pull set; a resume after kill -9 still has them."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

from agents.supervise.procinfo import alive
from tests.agent.stdio import request, serve
from tests.plugins.supervised import agent, wait_status
from tests.servers.ports import wait_until

SECRETS = {"api_key": "sk-SEKRIT-api-1234", "admin_api_key": "adm-SEKRIT-9876",
           "HF_TOKEN": "hf_SEKRIT_token_5678", "MY_CRED": "cred-SEKRIT-4242",
           # Nothing listens on port 1: the pager's failures (status, log) must not name it.
           "webhook": "http://127.0.0.1:1/services/T00/B00/SEKRIT-hook-2468"}


def _with_secrets(spec: Path) -> None:
    lines = spec.read_text().splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith("command ="))
    command = json.loads(lines[i].split("=", 1)[1])
    # The server reads its key from the environment, as the template's own shell text says.
    lines[i] = "command = " + json.dumps(command + ' --api-key "$SIM_API_KEY"')
    at = lines.index("[servers]") + 1
    lines[at:at] = [
        f'api_key = "{SECRETS["api_key"]}"',
        f'admin_api_key = "{SECRETS["admin_api_key"]}"',
        'secret_env = ["MY_CRED"]',
        f'env = {{ SIM_API_KEY = "{SECRETS["api_key"]}", HF_TOKEN = "{SECRETS["HF_TOKEN"]}", '
        f'MY_CRED = "{SECRETS["MY_CRED"]}", PLAIN_SETTING = "visible" }}',
    ]
    lines += ["", "[alerts]", f'webhook = "{SECRETS["webhook"]}"']
    spec.write_text("\n".join(lines) + "\n")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode().split("=", 1) for x in raw if b"=" in x)


def _leaks(run_dir: Path) -> list[str]:
    found = []
    for folder, _, files in os.walk(run_dir):
        for name in files:
            path = Path(folder) / name
            if path == run_dir / "secrets.json" or path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            found += [f"{path.relative_to(run_dir)}: {k}" for k, v in SECRETS.items()
                      if v.encode() in data]
    return found


def test_secrets_stay_out_of_every_served_file_and_survive_a_kill_9(supervised) -> None:
    run = supervised(1, prompts=400, sim_args="--time-scale 0.1")
    _with_secrets(run.spec)
    r = agent("up", str(run.spec))
    assert r.returncode == 0, r.stderr
    wait_status(run.run_dir, lambda s: s["progress"] and s["progress"]["completed"] > 40, 120,
                "running with the key")
    server = run.servers()[0]
    env = _environ(server["pid"])
    assert env["HF_TOKEN"] == SECRETS["HF_TOKEN"] and env["MY_CRED"] == SECRETS["MY_CRED"]
    launch = (run.run_dir / "launch" / "launch_gpu0.sh").read_text()
    assert "export PLAIN_SETTING=visible" in launch and "HF_TOKEN" in launch  # named, no value
    # kill -9: the supervisor and the server; the resume must find every secret again.
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    os.killpg(server["pid"], signal.SIGKILL)
    wait_until(lambda: not alive(server["pid"]), 120, "server gone")
    r = agent("resume", str(run.run_dir))
    assert r.returncode == 0, r.stderr
    done = wait_status(run.run_dir, lambda s: s["status"] == "done", 120, "done after resume")
    assert done["progress"]["completed"] == 400 and done["progress"]["failed"] == 0
    # The resumed supervisor has its webhook back (from secrets.json): it pages.
    assert done["pager"] is not None and done["pager"]["format"] == "slack"
    new = run.servers()[0]
    assert new["pid"] != server["pid"]
    assert _environ(new["pid"])["HF_TOKEN"] == SECRETS["HF_TOKEN"]
    # Where the secrets are: one file, owner only.
    st = os.stat(run.run_dir / "secrets.json")
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    # Everything the run serves: status, logs, samples, history, manifest, verify.
    out = serve(run.run_dir, request(1, "status"), request(2, "logs", name="supervisor"),
                request(3, "logs", name="secrets.json"), request(4, "samples", n=5),
                request(5, "history"), request(6, "manifest"),
                request(7, "manifest", path="secrets.json"), request(8, "verify"),
                request(9, "logs", name="../secrets"))
    answers = json.dumps(out.replies)
    assert not [k for k, v in SECRETS.items() if v in answers], "a secret in an RPC answer"
    listed = [e["path"] for e in out.by_id(6)["result"]["entries"]]
    assert "run.toml" in listed and "secrets.json" not in listed
    assert out.by_id(7)["result"]["entries"] == []
    assert "error" in out.by_id(3) and "error" in out.by_id(9)
    status = agent("status", str(run.run_dir), "--json").stdout
    assert not [k for k, v in SECRETS.items() if v in status]
    # Every other file of the run: the copy, the launch script, logs, control.log, state.
    assert _leaks(run.run_dir) == []
    copy = (run.run_dir / "run.toml").read_text()
    assert "api_key" in copy and "HF_TOKEN" in copy  # named as kept apart, never valued
    assert "alerts webhook" in copy
    agent("down", str(run.run_dir), "--yes")


def test_a_spec_with_secrets_in_its_own_run_dir_is_refused(tmp_path: Path, supervised) -> None:
    run = supervised(1, prompts=20)
    _with_secrets(run.spec)
    text = run.spec.read_text().replace('dir = "run"\n', "")
    run.spec.write_text(text)
    r = agent("up", str(run.spec))
    if r.returncode == 0:  # started in tmp_path, where the fixture does not look: stop it
        agent("down", str(tmp_path), "--yes")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "api_key" in r.stderr and "env HF_TOKEN" in r.stderr and "[run] dir" in r.stderr
    assert "alerts webhook" in r.stderr
    assert not [k for k, v in SECRETS.items() if v in r.stderr + r.stdout]
    assert not (tmp_path / "supervisor.pid").exists()
