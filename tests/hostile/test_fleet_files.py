"""Broken and hostile fleet files: each row runs the real `fleetdeck` on one, and expects exit
2 with a message naming the file and the problem, no traceback, and nothing written (the
pull dir, a watched fake HOME).

Node names matter beyond taste: a node's name is a folder of the pull dir (PULL_DIR/NODE/RUN),
so it must be one plain folder name, like a run's (issue 11, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.conftest import assert_only_changed, assert_refused, run_cli, tree


def fleet_text(name: str = "gen-1", extra: str = "", pulls: str = "PULLS") -> str:
    return "\n".join(["[console]", f'pull_dir = "{pulls}"', "", "[[nodes]]",
                      f"name = {toml_string(name)}", 'host = "127.0.0.1"', "port = 9",
                      'run_dir = "/data/run"', "connect_timeout_s = 1", extra, ""])


def toml_string(s: str) -> str:
    """A TOML basic string holding s exactly (control characters as \\uXXXX escapes)."""
    out = "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" for c in s)
    return f'"{out}"'


BAD_NAMES = [
    pytest.param("../../home/op", "'/'", id="name-path-up"),
    pytest.param("..", "not a folder name", id="name-dotdot"),
    pytest.param(".", "not a folder name", id="name-dot"),
    pytest.param("", "is empty", id="name-empty"),
    pytest.param("a/b", "'/'", id="name-slash"),
    pytest.param("/etc", "'/'", id="name-absolute"),
    pytest.param("gen\x1b[2J", "unprintable", id="name-terminal-escape"),
    pytest.param("gen\n1", "unprintable", id="name-newline"),
    pytest.param("gen\u202e1", "unprintable", id="name-bidi-override"),
    pytest.param("g" * 256, "255 bytes", id="name-too-long"),
]


@pytest.mark.parametrize(("name", "why"), BAD_NAMES)
def test_a_node_name_that_is_not_one_folder_name_is_refused(tmp_path: Path, home: Path,
                                                            name: str, why: str) -> None:
    fleet = tmp_path / "fleet.toml"
    pulls = tmp_path / "pulls"
    fleet.write_text(fleet_text(name, pulls=str(pulls)))
    before = tree(tmp_path)
    for args in (["pull", name or "x"], ["status"]):
        out = run_cli("fleetdeck", "--fleet", fleet, *args, env={"HOME": str(home)})
        assert_refused(out, 2, [str(fleet), "nodes[0]", "name", why])
        assert "\x1b" not in out.text and "\u202e" not in out.text, repr(out.text)
    assert_only_changed(before, tree(tmp_path))
    assert not pulls.exists()


def _not_utf8(path: Path) -> None:
    path.write_bytes(fleet_text().encode() + b"# caf\xe9\n")


def _folder(path: Path) -> None:
    path.mkdir()


def _not_toml(path: Path) -> None:
    path.write_text("[[nodes]\nname = 1\n")


def _unknown_key(path: Path) -> None:
    path.write_text(fleet_text(extra="colour = 'red'"))


def _no_host(path: Path) -> None:
    path.write_text(fleet_text().replace('host = "127.0.0.1"', ""))


def _twice(path: Path) -> None:
    path.write_text(fleet_text() + fleet_text().split("\n", 3)[3])


def _missing(path: Path) -> None:
    pass


def _wrong_type(path: Path) -> None:
    path.write_text(fleet_text().replace("port = 9", 'port = "twenty-two"'))


BROKEN_FILES = [
    pytest.param(_not_utf8, ["not UTF-8"], id="file-not-utf8"),
    pytest.param(_folder, ["folder"], id="file-is-a-folder"),
    pytest.param(_not_toml, ["not valid TOML"], id="file-not-toml"),
    pytest.param(_unknown_key, ["nodes[0]", "colour"], id="file-unknown-key"),
    pytest.param(_no_host, ["host is missing"], id="file-no-host"),
    pytest.param(_twice, ["used twice"], id="file-name-twice"),
    pytest.param(_missing, ["no fleet file"], id="file-missing"),
    pytest.param(_wrong_type, ["nodes[0]", "port"], id="file-port-not-a-number"),
]


@pytest.mark.parametrize(("make", "names"), BROKEN_FILES)
def test_a_broken_fleet_file_is_named_never_a_traceback(tmp_path: Path, home: Path,
                                                        make, names: list[str]) -> None:
    fleet = tmp_path / "fleet.toml"
    make(fleet)
    before = tree(tmp_path)
    out = run_cli("fleetdeck", "--fleet", fleet, "status", env={"HOME": str(home)})
    assert_refused(out, 2, [str(fleet), *names])
    assert_only_changed(before, tree(tmp_path))


def test_the_judge_accepts_a_good_fleet_file(tmp_path: Path, home: Path) -> None:
    """The rows above can fail: the same file with a good name gets past loading (exit 3: the
    node is not there)."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_text("gen-1.a_b c", pulls=str(tmp_path / "pulls")))
    out = run_cli("fleetdeck", "--fleet", fleet, "status", env={"HOME": str(home)})
    assert out.code == 3 and "gen-1.a_b c" in out.text, out.text
