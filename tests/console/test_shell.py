"""A shell on the node (issue 23, item 4): the key lends the terminal to `ssh -t` with the fleet
file's settings (the host key checked strictly against its known_hosts), in the node's run dir,
and the TUI comes back when the shell exits; a local node gets a shell here. Pilot checks the
command built and the refusals (read-only, no ssh, no terminal to lend); the real `fleetdeck`
in a real terminal (tmux) against the real sshd checks the rest."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.fleet import FleetScreen
from tests.console.conftest import on_screen, until
from tests.console.screen import Recorder
from tests.servers.ports import wait_until
from tests.servers.sshd import SshServer

ROOT = Path(__file__).resolve().parents[2]
RUN_DIR = "/data/runs/it's a run"  # a quote and a space, as a fleet file may well hold


class LentApp(FleetdeckApp):
    """The real app, but the terminal is never lent: what would run is kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lent: list[tuple[list[str], str | None]] = []

    async def lend_terminal(self, argv: list[str], cwd: str | None = None,
                            held: Callable[[int], str | None] = lambda _code: None) -> int:
        self.lent.append((argv, cwd))
        return 0


def remote_node(**over: Any) -> Node:
    fields: dict[str, Any] = dict(
        name="gen-1", host="gpu-7.example", port=2222, user="on call",
        identity_file="/keys/id_%h", known_hosts="/keys/known hosts", run_dir=RUN_DIR,
        connect_timeout_s=7.5, keepalive_s=15)
    return Node(**{**fields, **over})


def fleet_of(*nodes: Node, **console: Any) -> Fleet:
    return Fleet(nodes=list(nodes), console=ConsoleSettings(bell=False, **console),
                 source="fleet.toml")


async def press_shell(app: FleetdeckApp, pilot: Any) -> None:
    """The key on the fleet view, once its cursor is on the first node's row."""
    await until(pilot, lambda: on_screen(app, FleetScreen) and app.current_node(), 60,
                "the fleet view with a node under the cursor")
    await pilot.press("exclamation_mark")
    await pilot.pause()


async def test_the_key_runs_ssh_with_the_fleet_files_settings_into_the_run_dir() -> None:
    app = LentApp(fleet_of(remote_node()), connect=False)
    async with app.run_test() as pilot:
        await press_shell(app, pilot)
        await until(pilot, lambda: app.lent, 60, "the shell started")
    ((argv, cwd),) = app.lent
    assert cwd is None  # ssh cds on the node
    assert argv[0] == shutil.which("ssh")
    assert argv[1:] == [
        "-t",
        "-o", "StrictHostKeyChecking=yes", "-o", "CheckHostIP=yes",
        "-o", 'UserKnownHostsFile="/keys/known hosts"',
        "-o", "ConnectTimeout=8", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3",
        "-i", "/keys/id_%%h",  # ssh expands %h in an identity path: kept literal
        "-o", "Port=2222", "-o", 'User="on call"',
        "--", "gpu-7.example", argv[-1],
    ]
    # What the node's login shell reads (POSIX rules): sh -c, a script that goes into the run
    # dir, quoted whole, then becomes the user's login shell.
    outer = shlex.split(argv[-1])
    assert outer[:3] == ["exec", "sh", "-c"] and len(outer) == 4
    script = outer[3]
    assert shlex.split(script)[:4] == ["cd", "--", RUN_DIR, "||"]
    assert script.endswith('; exec "${SHELL:-/bin/sh}" -l')


async def test_a_bare_ipv6_host_and_no_optional_settings() -> None:
    node = Node(name="v6", host="fe80::1", run_dir="/r")
    app = LentApp(fleet_of(node), connect=False)
    async with app.run_test() as pilot:
        await press_shell(app, pilot)
        await until(pilot, lambda: app.lent, 60, "the shell started")
    argv = app.lent[0][0]
    assert argv[-3:-1] == ["--", "fe80::1"]  # ssh takes it bare (brackets are sftp's need)
    assert "-i" not in argv and not any(a.startswith(("Port=", "User=")) for a in argv)
    assert f"UserKnownHostsFile={os.path.expanduser('~/.ssh/known_hosts')}" in argv


async def test_a_local_node_gets_a_shell_here_in_its_run_dir(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("SHELL", "/bin/dash")
    app = LentApp(fleet_of(Node(name="here", run_dir=str(tmp_path), local=True)),
                  connect=False)
    async with app.run_test() as pilot:
        await press_shell(app, pilot)
        await until(pilot, lambda: app.lent, 60, "the shell started")
    assert app.lent == [(["/bin/dash"], str(tmp_path))]


async def test_read_only_refuses_the_shell_from_keys_and_palette() -> None:
    from tests.console.test_actions_live import palette_titles

    app = LentApp(fleet_of(remote_node()), read_only=True, connect=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await press_shell(app, pilot)
        assert "exclamation_mark" not in app.screen.active_bindings
        assert "Shell" not in await palette_titles(pilot, app, "Shell")
        await pilot.press("exclamation_mark")
        await pilot.pause(0.2)
        assert app.lent == []
    writable = LentApp(fleet_of(remote_node()), connect=False)
    async with writable.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: on_screen(writable, FleetScreen), 60, "the fleet view")
        assert "exclamation_mark" in writable.screen.active_bindings
        assert "Shell" in await palette_titles(pilot, writable, "Shell")


async def test_no_ssh_here_is_said_not_crashed(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nowhere holds ssh
    rec = Recorder()
    app = LentApp(fleet_of(remote_node()), connect=False)
    async with app.run_test(message_hook=rec) as pilot:
        await press_shell(app, pilot)
        await until(pilot, lambda: rec.has("gen-1: ssh is not installed here"), 60,
                    "no ssh named")
        assert app.lent == [] and app.is_running


async def test_a_console_without_a_terminal_says_it_cannot_lend_one() -> None:
    """The real lend_terminal under Pilot's headless driver: nothing to suspend."""
    rec = Recorder()
    app = FleetdeckApp(fleet_of(remote_node()), connect=False)
    async with app.run_test(message_hook=rec) as pilot:
        await press_shell(app, pilot)
        await until(pilot, lambda: rec.has("cannot lend its terminal"), 60, "the refusal")
        assert app.is_running and not app.render_errors


# -- a real terminal -------------------------------------------------------------------------


class Tmux:
    """One tmux server of its own (its socket in a short folder of the test's: Unix socket
    paths are short), one window."""

    def __init__(self, folder: Path) -> None:
        self.socket = str(folder / "tmux.sock")

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout

    def start(self, command: str) -> None:
        self.run("new-session", "-d", "-s", "t", "-x", "200", "-y", "50", command)
        self.run("set-option", "-t", "t", "remain-on-exit", "on")

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.run("send-keys", "-t", "t", *(["-l"] if literal else []), *keys)

    def type(self, line: str) -> None:
        self.keys(line, literal=True)
        self.keys("Enter")

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-J", "-t", "t")

    def foreground(self) -> str:
        """The name of the command the pane's terminal has in its foreground (what a Ctrl-C
        typed now goes to)."""
        return self.run("display-message", "-p", "-t", "t", "#{pane_current_command}").strip()

    def wait(self, cond: Callable[[str], bool], what: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if cond(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; "
                                     f"the terminal shows:\n{text}")
            time.sleep(0.1)

    def kill(self) -> None:
        """The server and the pane's processes (the TUI, a shell it lent the terminal to)."""
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing: make system-deps installs it")
    with tempfile.TemporaryDirectory(prefix="fd-tmux-") as folder:
        t = Tmux(Path(folder))
        try:
            yield t
        finally:
            t.kill()


def fleet_toml(sshd: SshServer, remote: Path, local: Path, wrong_known: Path) -> str:
    agent = f"{sys.executable} -m agents.cli"
    common = [f'host = "{sshd.host}"', f"port = {sshd.port}", f'user = "{sshd.user}"',
              f'identity_file = "{sshd.client_key}"', f'agent = "{agent}"',
              "connect_timeout_s = 30"]
    return "\n".join([
        "[console]", "bell = false", "",
        "[[nodes]]", 'name = "gen-1"', *common, f'known_hosts = "{sshd.known_hosts}"',
        f"run_dir = {_toml(str(remote))}", "",
        # Its known_hosts holds another key for the node: strict checking must refuse.
        "[[nodes]]", 'name = "gen-2"', *common, f'known_hosts = "{wrong_known}"',
        f"run_dir = {_toml(str(remote))}", "",
        "[[nodes]]", 'name = "here"', "local = true", f'agent = "{agent}"',
        f"run_dir = {_toml(str(local))}", ""])


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def prompt_after_ctrl_c(text: str) -> bool:
    """The shell has taken a Ctrl-C and drawn a fresh prompt: what is typed now is read whole
    (typed sooner, bash may drop its first characters with the cancelled line)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return len(lines) >= 2 and lines[-2].endswith("^C") and lines[-1].endswith(("#", "$"))


def tui_is_up(text: str) -> bool:
    return bool(re.search(r"fleetdeck\s+3 nodes", text))


def test_a_shell_on_the_node_in_a_real_terminal(sshd: SshServer, tmux: Tmux,
                                                 tmp_path: Path) -> None:
    remote = tmp_path / "run 'gen-1'"  # a quote and a space in the run dir
    local = tmp_path / "local run"
    remote.mkdir()
    local.mkdir()
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong_known = tmp_path / "known_hosts_wrong"
    wrong_known.write_text(f"[{sshd.host}]:{sshd.port} "
                           + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    wrong_before = wrong_known.read_text()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_toml(sshd, remote, local, wrong_known))
    # SSH_CONNECTION unset: a shell that has it was reached over ssh. COLUMNS and LINES
    # unset: the TUI takes tmux's size, not pytest's terminal's.
    tmux.start(f"cd {ROOT} && exec env -u SSH_CONNECTION -u COLUMNS -u LINES SHELL=/bin/bash "
               f"{sys.executable} -m console.cli --fleet '{fleet}'")
    tmux.wait(lambda t: tui_is_up(t) and "gen-1" in t and "here" in t, "the TUI")

    # gen-1 (the first row): ssh into its run dir, on the node.
    tmux.keys("!")
    tmux.wait(lambda t: not tui_is_up(t), "the TUI to step aside")
    tmux.type('echo "WHERE=$PWD VIA=${SSH_CONNECTION%% *}"')
    tmux.wait(lambda t: f"WHERE={remote} VIA=127.0.0.1" in t, "a shell on the node in its run dir")
    tmux.keys("C-c")  # the node's, not the TUI's
    tmux.wait(prompt_after_ctrl_c, "the node's shell to take Ctrl-C")
    tmux.type("echo ALIVE_$((40+2))")
    tmux.wait(lambda t: "ALIVE_42" in t, "the shell after Ctrl-C")
    tmux.type("exit")
    tmux.wait(lambda t: tui_is_up(t) and "gen-1: shell closed (exit status 0)" in t,
              "the TUI back, the shell's end reported")

    # gen-2: its known_hosts holds another key, so ssh refuses and says so.
    tmux.keys("Down")
    tmux.keys("!")
    text = tmux.wait(lambda t: "Press Enter to go back to fleetdeck" in t,
                     "ssh's refusal held on screen")
    assert "Host key verification failed" in text
    assert wrong_known.read_text() == wrong_before  # nothing added
    tmux.keys("Enter")
    tmux.wait(lambda t: tui_is_up(t) and "gen-2: shell: ssh ended with 255" in t,
              "the TUI back, the failure reported")

    # here: a local shell in its run dir; Ctrl-C stops its command, not the TUI.
    tmux.keys("Down")
    tmux.keys("!")
    tmux.wait(lambda t: not tui_is_up(t), "the TUI to step aside")
    tmux.type('echo "WHERE=$PWD VIA=${SSH_CONNECTION:-none}"')
    tmux.wait(lambda t: f"WHERE={local} VIA=none" in t, "a local shell in the run dir")
    tmux.type("sleep 60; echo NOT_INTERRUPTED")
    # Ctrl-C once sleep holds the terminal: sent sooner, it can reach bash between reading
    # the line and handing the terminal to sleep, and be lost (sleep then ran its 60 s).
    wait_until(lambda: tmux.foreground() == "sleep", 120, "sleep in the terminal's foreground")
    tmux.keys("C-c")
    tmux.wait(prompt_after_ctrl_c, "the local shell to take Ctrl-C")
    tmux.type("echo ALIVE_$((20+1))")
    text = tmux.wait(lambda t: "ALIVE_21" in t, "the local shell after Ctrl-C")
    assert "NOT_INTERRUPTED" not in text.replace("echo NOT_INTERRUPTED", "")
    tmux.type("exit")
    tmux.wait(lambda t: tui_is_up(t) and "here: shell closed" in t, "the TUI back again")
    # It reads keys again: the theme key answers. (Not `q`: quitting this fleet can hang
    # with no shell ever opened, a separate fault.)
    tmux.keys("t")
    tmux.wait(lambda t: "theme fleetdeck-light" in t, "the TUI answering keys again")
