"""The failures screen through the real TUI (Pilot): a supervised run whose simulated servers
answer 503 to a share of requests, its key pressed while the run goes on, then read again
once it is done, every figure judged by failures.jsonl on disk."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.text import Text
from textual.widgets import DataTable, Label, Static

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.failures import FailuresScreen
from tests.agent.failures_disk import expected
from tests.console import data as d
from tests.console.conftest import on_screen, until
from tests.console.screen import Recorder
from tests.plugins.supervised import agent


def _cells(table: DataTable[Text]) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_the_failures_key_shows_the_journal_by_class(supervised, tmp_path: Path) -> None:
    run = supervised(2, prompts=400, sim_args="--error-rate 0.2 --error-status 503",
                     retries=1, concurrency_per_server=2)
    assert agent("up", str(run.spec)).returncode == 0
    node = Node(name="gen-1", run_dir=str(run.run_dir), local=True,
                agent=f"{sys.executable} -m agents.cli")
    app = FleetdeckApp(Fleet(nodes=[node], console=ConsoleSettings(bell=False),
                             source="(test)"))
    journal = run.run_dir / "failures.jsonl"
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.state.nodes["gen-1"].link == "connected", 120,
                    "connected")
        await until(pilot, lambda: journal.exists() and journal.stat().st_size > 0, 120,
                    "a first failure on disk")
        await pilot.press("F")
        screen = await until(pilot, lambda: on_screen(app, FailuresScreen), 60,
                             "the failures screen")
        assert isinstance(screen, FailuresScreen)
        table = screen.query_one("#failures-table", DataTable)
        await until(pilot, lambda: table.row_count > 0, 120, "the first answer")

        def done() -> bool:
            snap = app.state.nodes["gen-1"].snapshot
            return snap is not None and snap.status == "done"

        await until(pilot, done, 300, "the run done")
        await pilot.press("r")  # read again: the node reads on from where it stopped
        want = expected(journal)[("failed", "http_503")]
        await until(pilot, lambda: table.row_count == 1 and
                    _cells(table)[0][2] == f"{want['count']:,}", 120,
                    "the figures of the whole journal")
        assert set(expected(journal)) == {("failed", "http_503")}
        event, label, _, first, last, servers = _cells(table)[0]
        assert (event, label) == ("failed", "HTTP 503")
        assert first.startswith(time.strftime("%H:%M:%SZ (", time.gmtime(min(want["times"]))))
        assert last.startswith(time.strftime("%H:%M:%SZ (", time.gmtime(max(want["times"]))))
        assert servers == ", ".join(f"{s} ({c:,})" for s, c in sorted(
            want["servers"].items(), key=lambda sc: (-sc[1], sc[0])))
        headline = str(screen.query_one("#failures-headline", Label).render())
        assert headline.startswith(f"{want['count']:,} failed and 0 requeued in 1 class")
        examples = str(screen.query_one("#failures-examples", Static).render())
        last_line, last_raw = want["lines"][-1]
        assert f"line {last_line}: {last_raw}" in examples.replace("\n", "")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, FailuresScreen), 60, "closed")
        assert not app.render_errors


async def test_the_failures_key_on_a_node_not_connected_says_so() -> None:
    rec = Recorder()
    app = FleetdeckApp(d.fleet(bell=False), connect=False, clock=lambda: d.NOW)
    async with app.run_test(size=(160, 48), message_hook=rec) as pilot:
        app.ingest("gen-1", d.generate_snapshot())
        await pilot.pause()
        await pilot.press("F")
        await until(pilot, lambda: rec.has("gen-1: Failures failed: not connected"), 60,
                    "the refusal")
        assert not isinstance(app.screen, FailuresScreen)
