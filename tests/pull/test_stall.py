"""A pull's stall limit (console/artifacts/pull.py `watched`): what waits on the node is
stopped once nothing has arrived for the limit, and only then. Over the real sshd with an agent
that goes silent: tests/hostile/test_stream_answers.py."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.rundir.schema import ManifestEntry
from console.artifacts.pull import PART_SUFFIX, Puller, Stalled, watched
from console.artifacts.sources import LocalSource


async def test_what_goes_quiet_is_cancelled_at_the_limit() -> None:
    cancelled = asyncio.Event()

    async def quiet() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(Stalled, match=r"sent nothing for 0\.5 s"):
        await watched(quiet(), lambda: 0, 0.5)
    assert loop.time() - t0 >= 0.5
    assert cancelled.is_set()


async def test_what_keeps_coming_runs_past_the_limit() -> None:
    """Three times the limit, a little at a time: never stopped, its result returned (the
    limit well above the trickle's pace, so a loaded loop's late wake-up is not a stall)."""
    got = [0]

    async def trickle() -> str:
        for _ in range(60):
            await asyncio.sleep(0.05)  # the node's pace, the thing under test
            got[0] += 1
        return "whole"

    assert await watched(trickle(), lambda: got[0], 1.0) == "whole"


class GoesQuiet(LocalSource):
    """A node that sends the first `upto` bytes of each file, then nothing, alive."""

    def __init__(self, run_dir: str, upto: int) -> None:
        super().__init__(run_dir)
        self.upto = upto

    async def read(self, rel: str, offset: int, length: int,
                   sink: Callable[[bytes], None]) -> None:
        sink((Path(self.run_dir) / rel).read_bytes()[offset:offset + self.upto])
        await asyncio.Event().wait()


async def test_the_file_by_file_path_fails_a_quiet_file_and_keeps_its_part(
        tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    data = b"0123456789" * 1000
    (node / "a.log").write_bytes(data)
    entry = ManifestEntry(path="a.log", kind="other", size=len(data), mtime=0.0, mtime_ns=0,
                          sha256=hashlib.sha256(data).hexdigest())
    dest = tmp_path / "dest"
    report = await Puller(GoesQuiet(str(node), 300), dest, stall_s=0.5).run([entry])
    assert list(report.failed) == ["a.log"]
    assert "the node sent nothing for 0.5 s" in report.failed["a.log"]
    assert not (dest / "a.log").exists()
    assert (dest / ("a.log" + PART_SUFFIX)).read_bytes() == data[:300]
    # The next pull, from a node that sends, resumes from the part.
    again = await Puller(LocalSource(str(node)), dest, stall_s=0.5).run([entry])
    assert again.ok and again.resumed == {"a.log": 300}
    assert (dest / "a.log").read_bytes() == data
