"""A run's raw history read a page at a time (console/runhistory.py), from a pulled copy and
through the real agent (`serve --stdio`): no sample is lost where two share the time at a
page's edge (the engine's closing sample may repeat the last one's), each page reads on from
where the last ended, and a recorded server key that is a Unicode digit ('²') is passed over,
never a crash."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agents.rundir import browse
from console.fleet import Node
from console.replay import load
from console.report.series import RunHistory
from console.runhistory import PAGE, HistoryRead, read_dir, read_link
from console.transport import AgentLink
from tests.agent.histories import sample, write_history

T0 = 1_700_000_000.0


def run_with_a_tie_at_the_page_edge(run_dir: Path) -> list[dict[str, object]]:
    """PAGE samples, then the engine's closing one at the same time as the last: a page
    ends on the first of the two. A bad line first, counted once however many pages."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "history.jsonl", "w") as f:
        f.write("not json\n")
    items = write_history(run_dir / "history.jsonl", T0, PAGE)
    done = {**items[-1], "status": "done", "completed": items[-1]["completed"] + 1}
    with open(run_dir / "history.jsonl", "a") as f:
        f.write(json.dumps(done) + "\n")
    return [*items, done]


def test_a_pulled_run_loses_no_sample_that_shares_the_page_edge_s_time(tmp_path: Path) -> None:
    written = run_with_a_tie_at_the_page_edge(tmp_path / "run")
    info = HistoryRead()
    pages = list(read_dir(tmp_path / "run", info))
    assert [len(p) for p in pages] == [PAGE, 1]
    got = [i for p in pages for i in p]
    assert got == written and got[-1]["status"] == "done"
    assert info.bad_lines == 1 and not info.cut


def test_each_page_reads_on_from_the_last_one_s_end(tmp_path: Path) -> None:
    run_with_a_tie_at_the_page_edge(tmp_path / "run")
    first = browse.history(tmp_path / "run", limit=10)
    second = browse.history(tmp_path / "run", limit=10, offset=first["next_offset"])
    assert first["bad_lines"] == 1 and second["bad_lines"] == 0  # not read again
    assert [i["completed"] for i in second["items"]] == [3 * k for k in range(10, 20)]
    with pytest.raises(ValueError, match="not a line's start"):
        browse.history(tmp_path / "run", offset=first["next_offset"] - 1)


async def test_through_the_agent_too(tmp_path: Path) -> None:
    written = run_with_a_tie_at_the_page_edge(tmp_path / "run")
    link = AgentLink(Node(name="local-1", run_dir=str(tmp_path / "run"), local=True,
                          agent=f"{sys.executable} -m agents.cli"))
    await link.connect()
    try:
        info = HistoryRead()
        got = [i async for page in read_link(link, "local-1", info) for i in page]
    finally:
        await link.close()
    assert len(got) == len(written) and got[-1]["status"] == "done"
    assert info.bad_lines == 1


def test_replay_passes_over_a_unicode_digit_server_key(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    written = write_history(run / "history.jsonl", T0, 5)
    odd = sample(5, T0 + 50)
    odd["servers"]["²"] = odd["servers"].pop("1")
    with open(run / "history.jsonl", "a") as f:
        f.write(json.dumps(odd) + "\n")
    rec = load(run)
    assert len(rec.samples) == len(written) and rec.skipped == 1
    rec.cursor = len(rec.samples) - 1
    assert [s.number for s in rec.snapshot().servers] == [0, 1]


def test_the_report_orders_servers_past_a_unicode_digit_key(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    write_history(run / "history.jsonl", T0, 3)
    odd = sample(3, T0 + 30)
    odd["servers"]["²"] = odd["servers"].pop("1")
    with open(run / "history.jsonl", "a") as f:
        f.write(json.dumps(odd) + "\n")
    h = RunHistory("gen-1")
    for page in read_dir(run):
        h.add(page)
    h.finish()
    assert h.servers() == ["0", "1", "²"]
