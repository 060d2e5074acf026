"""`fleetdeck logs NODE NAME --follow` as a person runs it, over a real sshd: the tail, then
each line appended to the node's log as it comes (escapes shown, not obeyed), all over one
SSH connection, until Ctrl-C (SIGINT) ends it with exit 0 and no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.console_headless.test_headless_ssh import node_toml
from tests.servers.sshd import SshServer


class Lines:
    """A process's stdout lines, read as they come on a thread of its own."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.got: list[str] = []
        assert proc.stdout is not None
        out = proc.stdout
        self.thread = threading.Thread(target=lambda: self.got.extend(
            line.rstrip("\n") for line in out), daemon=True)
        self.thread.start()

    def wait_for(self, wanted: list[str], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.got[-len(wanted):] != wanted:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {wanted}; got {self.got[-10:]}")
            time.sleep(0.05)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def logins(sshd: SshServer) -> int:
    return sshd.log_text().count("Accepted publickey")


def test_logs_follow_prints_new_lines_and_ends_cleanly_on_ctrl_c(sshd: SshServer,
                                                                   tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = run_dir / "logs" / "generate.log"
    log.write_bytes(b"".join(b"old %d\n" % i for i in range(20)))
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, run_dir))
    before = logins(sshd)
    proc = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "--fleet", str(fleet), "logs", "gen-1",
         "generate", "--follow", "-n", "3", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = Lines(proc)
        out.wait_for(["old 17", "old 18", "old 19"])
        append(log, b"new one\nnew two\n")
        out.wait_for(["new one", "new two"])
        # A line written in two pieces is printed once, whole; an escape is shown, not obeyed.
        append(log, b"half")
        append(log, b" and half \x1b]0;pwned\x07\n")
        out.wait_for(["half and half \\x1b]0;pwned\\x07"])
        # Many calls by now (one per 0.2 s), one login: the same connection throughout.
        assert logins(sshd) - before == 1, sshd.log_text()[-2000:]
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert code == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    out.thread.join(timeout=60)
    assert out.got[:3] == ["old 17", "old 18", "old 19"]
    assert out.got.count("new one") == 1 and not any(x == "half" for x in out.got)


def test_logs_without_follow_prints_the_tail_and_exits(sshd: SshServer, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "supervisor.log").write_bytes(b"a\nb\nc\nbeing writ")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(node_toml("gen-1", sshd, run_dir))
    r = subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet), "logs",
                        "gen-1", "supervisor", "-n", "2"], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["c", "being writ"]  # the tail as it is now
    r = subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet), "logs",
                        "gen-1", "../run.toml"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 1 and "refused" in r.stderr and r.stdout == ""
    assert os.path.exists(run_dir / "logs" / "supervisor.log")


OLD_AGENT = Path(__file__).resolve().parents[1] / "servers" / "old_log_agent.py"


def old_agent_fleet(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "generate.log").write_bytes(
        b"".join(b"old %d\n" % i for i in range(20)))
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'[[nodes]]\nname = "gen-1"\nlocal = true\nrun_dir = "{run_dir}"\n'
                     f'agent = "{sys.executable} {OLD_AGENT}"\n')
    return fleet


def test_an_agent_from_before_following_still_shows_its_tail(tmp_path: Path) -> None:
    """An agent whose `logs` answers no next_from (a tail only): `logs` prints it and exits 0;
    `--follow` prints it once, says once that following needs a bootstrap, and ends."""
    fleet = old_agent_fleet(tmp_path)
    cmd = [sys.executable, "-m", "console.cli", "--fleet", str(fleet), "logs", "gen-1",
           "generate", "-n", "3"]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == ["old 17", "old 18", "old 19"]
    assert "bootstrap" not in plain.stderr  # following was not asked for
    follow = subprocess.run([*cmd, "--follow", "--interval", "0.2"], capture_output=True,
                            text=True, timeout=180)
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.splitlines() == ["old 17", "old 18", "old 19"]
    assert follow.stderr.count("fleetdeck bootstrap NODE") == 1, follow.stderr
