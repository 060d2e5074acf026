"""Parts landed in groups (console/artifacts/landing.py): each file's own outcome (landed,
refused for its sha256, or the OSError that stopped it) whatever the others' in its group,
and groups formed from the checks that come due together; `Confiner` answers as `confined`
always did (each path resolved whole), with the root and folders resolved once."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from console.artifacts import landing
from console.artifacts.landing import Lander, Landing, land_group
from console.artifacts.pullset import Confiner
from console.artifacts.sources import PullError


def part(folder: Path, name: str, data: bytes, claimed: bytes | None = None) -> Landing:
    p = folder / f"{name}.fdpart"
    p.write_bytes(data)
    return Landing(p, folder / name, len(claimed if claimed is not None else data),
                   hashlib.sha256(claimed if claimed is not None else data).hexdigest())


def test_each_file_of_a_group_lands_or_fails_on_its_own(tmp_path: Path) -> None:
    good = part(tmp_path, "good", b"abc")
    lied = part(tmp_path, "lied", b"abd", claimed=b"abc")  # the bytes differ from the manifest
    blocked = part(tmp_path, "blocked", b"xyz")
    (tmp_path / "blocked").mkdir()  # a folder where the file goes: the rename fails
    (tmp_path / "blocked" / "keep").write_text("x")
    longer = part(tmp_path, "grown", b"abcdef", claimed=b"abc")  # a log grown since: cut
    got = land_group([good, lied, blocked, longer])
    assert got[0] is True and got[1] is False and got[3] is True
    assert isinstance(got[2], OSError)
    assert (tmp_path / "good").read_bytes() == b"abc" and not good.part.exists()
    assert not (tmp_path / "lied").exists() and not lied.part.exists()  # refused, removed
    assert blocked.part.read_bytes() == b"xyz"  # kept for the next pull to look at
    assert (tmp_path / "grown").read_bytes() == b"abc"


def test_a_missing_part_is_its_own_error(tmp_path: Path) -> None:
    gone = Landing(tmp_path / "gone.fdpart", tmp_path / "gone", 3,
                   hashlib.sha256(b"abc").hexdigest())
    ok = part(tmp_path, "ok", b"abc")
    got = land_group([gone, ok])
    assert isinstance(got[0], FileNotFoundError) and got[1] is True


def test_checks_that_come_due_together_land_together(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    groups: list[int] = []
    real = landing.land_group

    def counted(items: list[Landing]) -> list[bool | OSError]:
        groups.append(len(items))
        return real(items)

    monkeypatch.setattr(landing, "land_group", counted)
    items = [part(tmp_path, f"f{i}", os.urandom(100)) for i in range(200)]
    items.append(part(tmp_path, "bad", b"1", claimed=b"2"))

    async def main() -> list[bool | BaseException]:
        lander = Lander()
        return await asyncio.gather(*(lander.land(it) for it in items),
                                    return_exceptions=True)

    got = asyncio.run(main())
    assert got[:-1] == [True] * 200 and got[-1] is False
    assert sum(groups) == 201 and len(groups) < 20, groups
    for it in items[:-1]:
        assert it.final.exists() and not it.part.exists()


def test_a_lander_raises_a_files_oserror_to_its_caller_alone(tmp_path: Path) -> None:
    ok = part(tmp_path, "ok", b"abc")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x").write_text("x")
    blocked = part(tmp_path, "dir", b"abc")

    async def main() -> list[bool | BaseException]:
        lander = Lander()
        return await asyncio.gather(lander.land(ok), lander.land(blocked),
                                    return_exceptions=True)

    got = asyncio.run(main())
    assert got[0] is True and isinstance(got[1], OSError)


def _confined_reference(root: Path, rel: str) -> Path:
    """`confined` as it was before the Confiner: every path resolved whole."""
    path = root / rel
    real_root, real = root.resolve(), path.resolve()
    if real == real_root or not real.is_relative_to(real_root):
        raise PullError("outside")
    return path


def test_the_confiner_answers_as_resolving_each_path_whole(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    (root / "a" / "b").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "out").symlink_to(tmp_path / "outside")  # a folder leading out
    (root / "a" / "in").symlink_to(root / "a" / "b")  # a folder that stays in
    (root / "a" / "b" / "leak").symlink_to(tmp_path / "outside" / "x")  # a file leading out
    (root / "a" / "b" / "ok").symlink_to(root / "a" / "f")  # a file that stays in
    (root / "a" / "b" / "self").symlink_to(root)  # the root itself
    (root / "loop").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop")
    rels = ["a/b/c.log", "a/new/deeper/x", "out/x", "out/deeper/x", "a/in/c.log", "a/in/leak",
            "a/b/leak", "a/b/ok", "a/b/self", "a/b/self/a/b/c.log", "loop", "new.log",
            "a/b/../b/c.log"]
    confine = Confiner(root)
    for rel in rels * 2:  # the second time from the folders it resolved before
        try:
            want: Path | str = _confined_reference(root, rel)
        except (PullError, RuntimeError) as exc:
            want = type(exc).__name__
        try:
            got: Path | str = confine(rel)
        except (PullError, RuntimeError) as exc:
            got = type(exc).__name__
        assert got == want, rel
