"""File names the console does not choose (issue 11, item 2): a name in RUN_DIR that is not
UTF-8, or that holds terminal escapes, over the real agent and the real sshd.

Before: `fleetdeck-agent manifest` died with a traceback on such a name, `pull` said the
node was unreachable (exit 3), so the gate could never pass. Now the name travels as its
bytes, the copy here has the very same name and bytes by either data path, and wherever a
name is shown on the terminal its control characters and undecodable bytes are escaped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.servers.s3 import S3Server
from tests.servers.sshd import SshServer

AGENT = f"{sys.executable} -m agents.cli"
ROOT = Path(__file__).resolve().parents[2]

# bytes names, as a node's file system holds them
NOT_UTF8 = b"logs/caf\xe9-latin1.log"
ESCAPES = b"logs/\x1b]0;owned\x07\x1b[2Jred.log"
BOTH = b"logs/\xff\xfe\x1b[31m.log"


@pytest.fixture
def odd_run(tmp_path: Path, sims, s3: S3Server) -> Path:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 60)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], s3=s3, batch_size=25)
    engine = start_engine(spec, env=s3.env())
    assert engine.wait(300) == 0, engine.stderr()
    run_dir = engine.run_dir
    for name in (NOT_UTF8, ESCAPES, BOTH):
        with open(os.fsencode(run_dir) + b"/" + name, "wb") as f:
            f.write(b"the contents of " + name + b"\n")
    return run_dir


def cli(*args: str | Path, env: dict[str, str] | None = None,
        module: str = "console.cli") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})


def terminal_safe(out: bytes) -> str:
    text = out.decode("utf-8", "replace")
    for ch in ("\x1b", "\x07", "\ufffd"):
        assert ch not in text.replace("\r", ""), f"{ch!r} reached the terminal: {text!r}"
    return text


def test_the_agent_lists_every_name(odd_run: Path) -> None:
    r = cli("manifest", "--json", odd_run, module="agents.cli")
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()
    entries = {e["path"]: e for e in json.loads(r.stdout)["entries"]}
    assert entries["logs/caf\\xe9-latin1.log"]["path_b64"]  # the bytes travel whole
    assert entries["logs/caf\\xe9-latin1.log"]["sha256"]
    assert entries[ESCAPES.decode()]["path_b64"] is None  # UTF-8, if odd: as it is
    r = cli("manifest", odd_run, module="agents.cli")
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()
    assert b"caf\\xe9-latin1.log" in r.stdout


@pytest.mark.parametrize("data_path", ["stream", "openssh", "asyncssh"])
def test_pull_copies_odd_names_whole_and_shows_them_escaped(sshd: SshServer, odd_run: Path,
                                                           tmp_path: Path, s3: S3Server,
                                                           data_path: str) -> None:
    if data_path == "openssh" and shutil.which("sftp") is None:
        pytest.skip("OpenSSH's sftp client is not installed")
    pulls = tmp_path / "pulls"
    fleet = tmp_path / "fleet.toml"
    agent = "env " + " ".join(f"{k}={v}" for k, v in s3.env().items()) + " " + AGENT
    fleet.write_text("\n".join([
        "[console]", f'pull_dir = "{pulls}"', "", "[[nodes]]", 'name = "gen-1"',
        'host = "127.0.0.1"', f"port = {sshd.port}", f'user = "{sshd.user}"',
        f'identity_file = "{sshd.client_key}"', f'known_hosts = "{sshd.known_hosts}"',
        f'run_dir = "{odd_run}"', f'agent = "{agent}"', ""]))
    env = {**s3.env(), "FLEETDECK_PULL_DATA_PATH": data_path}
    r = cli("--fleet", fleet, "pull", "gen-1", env=env)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    terminal_safe(r.stderr)
    dest = os.fsencode(pulls / "gen-1" / "test-run")
    for name in (NOT_UTF8, ESCAPES, BOTH):
        with open(dest + b"/" + name, "rb") as f:  # the very same name, the very same bytes
            assert f.read() == b"the contents of " + name + b"\n"
    saved = json.loads(Path(os.fsdecode(dest + b"/.fleetdeck/manifest.json")).read_text())
    assert any(e["path_b64"] for e in saved)

    r = cli("--fleet", fleet, "decommission-check", "gen-1", env=env)
    text = terminal_safe(r.stdout + r.stderr)
    assert r.returncode == 0, text
    assert "SAFE to give the node back" in text

    # A copy gone: the gate names it, escaped, as missing.
    os.unlink(dest + b"/" + BOTH)
    r = cli("--fleet", fleet, "decommission-check", "gen-1", env=env)
    text = terminal_safe(r.stdout + r.stderr)
    assert r.returncode == 1, text
    assert "logs/\\xff\\xfe\\x1b[31m.log" in text
