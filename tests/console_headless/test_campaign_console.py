"""Campaigns on the console: `[[campaigns]]` in the fleet file, what `launch CAMPAIGN` carries
to each node (its name in the queue), the check round's verdict (the same prompts, one queue
prefix, a run dir each), and the roll-up of the nodes' figures with the queue's own (chunks
committed of all; nodes its records say were given back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.rundir.schema import Snapshot
from console.fleet import Campaign, Fleet, FleetError, Node, load_fleet
from console.queue.launch import check_problems, launch_params
from console.queue.rollup import GIVEN_BACK, Member, human, roll_up
from tests.console import data as d


def three_nodes() -> Fleet:
    nodes = [Node(name=n, run_dir=f"/r/{n}", local=True) for n in ("gen-1", "gen-2", "gen-3")]
    return Fleet(nodes=nodes, campaigns=[Campaign("traces", ["gen-1", "gen-2", "gen-3"])],
                 source="fleet.toml")


def node_snapshot(name: str, committed: int, held: list[str],
                  tally: dict[str, int] | None = None, **progress: Any) -> Snapshot:
    queue = {"node": name, "run_id": f"run-{name}", "chunks": 10, "committed": committed,
             "committed_here": 2, "lost": 0, "held": held, "prompts_lines": 10_000,
             "chunk_size": 1000, **(tally or {})}
    p = d.progress(run="traces", campaign="traces", queue=queue, **progress)
    raw = d.generate_snapshot(run="traces", status=p["status"], progress=p, alerts=[])
    return msgspec.convert(raw, Snapshot)


def test_the_fleet_file_has_no_shards_and_refuses_the_old_keys(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    nodes = "".join(f'[[nodes]]\nname = "{n}"\nlocal = true\nrun_dir = "/r/{n}"\n'
                    for n in ("a", "b"))
    path.write_text(nodes + '[[campaigns]]\nname = "c"\nnodes = ["a", "b"]\n'
                    'rebalance = "auto"\n')
    with pytest.raises(FleetError, match="rebalance"):
        load_fleet(path)
    path.write_text(nodes + '[[campaigns]]\nname = "c"\nnodes = ["a", "b"]\n')
    fleet = load_fleet(path)
    c = fleet.campaign("c")
    params = launch_params(fleet, c, fleet.node("b"), "/specs/run.toml")
    assert params == {"campaign": "c", "spec": "/specs/run.toml", "queue_node": "b"}


def answer(sha: str = "a" * 64, lines: int = 10_000, run_dir: str = "",
           prefix: str = "s3://b/campaigns/t/") -> dict[str, Any]:
    return {"prompts_sha256": sha, "prompts_lines": lines, "run_dir": run_dir,
            "queue_prefix": prefix, "kind": "generate"}


def test_the_check_round_names_every_problem_in_the_answers() -> None:
    fleet = three_nodes()
    c = fleet.campaign("traces")
    ok = {n: answer(run_dir=f"/r/{n}") for n in c.nodes}
    assert check_problems(fleet, c, ok) == []
    # A node joining a running campaign is checked alone.
    assert check_problems(fleet, c, {"gen-2": ok["gen-2"]}) == []
    (bad,) = check_problems(fleet, c, {**ok, "gen-2": answer("b" * 64, 201, "/r/gen-2")})
    assert "prompt files differ" in bad and "gen-2: " + "b" * 64 + " (201 lines)" in bad
    (bad,) = check_problems(fleet, c, {**ok, "gen-3": answer(run_dir="/r/gen-3",
                                                             prefix="s3://b/other/")})
    assert "share one queue" in bad and "gen-3: s3://b/other/" in bad
    (bad,) = check_problems(fleet, c, {**ok, "gen-3": answer(run_dir="/r/gen-1")})
    assert bad == "gen-1 and gen-3 would share the run directory /r/gen-1 on local"
    (bad,) = check_problems(fleet, c, {**ok, "gen-2": {**ok["gen-2"], "kind": "train"}})
    assert bad == "gen-2's spec is a train run, but campaign traces is of generate nodes"


def test_the_roll_up_counts_the_queues_chunks_and_the_given_back_nodes() -> None:
    fleet = three_nodes()
    c = fleet.campaign("traces")
    one = node_snapshot("gen-1", 6, ["7"], completed=3000, failed=10, truncated=40,
                        rate_per_sec=2.0)
    two = node_snapshot("gen-2", 5, ["8"], completed=2500, failed=5, truncated=60,
                        rate_per_sec=3.0)
    r = roll_up(fleet, c, [Member("gen-1", "connected", one), Member("gen-2", "connected", two),
                           Member("gen-3", "unreachable")], frozenset({"gen-3"}))
    # The freshest listing counts (commits only grow); what is left is the uncommitted
    # chunks' indices at the nodes' summed rate.
    assert (r.chunks, r.committed, r.total) == (10, 6, 10_000)
    assert r.completed == 5500 and r.failed == 15 and r.rate_per_sec == 5.0
    assert r.eta_hours == pytest.approx(4000 / 5.0 / 3600)
    assert [(x.node, x.link, x.held) for x in r.rows] == [
        ("gen-1", "connected", ["7"]), ("gen-2", "connected", ["8"]),
        ("gen-3", GIVEN_BACK, [])]
    head = human(r)[0]
    assert "6/10 chunks committed (60.0%)" in head and "5,500 lines done" in head
    assert any("gen-3 given back" in line for line in human(r))


def counted(commits: int, done: int, failed: int, truncated: int, here: tuple[int, int, int],
            lost_lines: int = 0) -> dict[str, int]:
    """A node's count of the commits it has read: the campaign's lines, and its part."""
    return {"commits_counted": commits, "lines_done": done, "lines_failed": failed,
            "lines_truncated": truncated, "done_here": here[0], "failed_here": here[1],
            "truncated_here": here[2], "lost_lines": lost_lines}


def test_the_lines_are_the_commits_count_of_the_node_that_read_most_of_them() -> None:
    """Each node's own figures over-count (gen-2's backup copy that lost, its retry lines of
    indices gen-1 had cut) or go below the commits (a retry on another node): the campaign's
    lines are the count of the node that has read the most commit objects, each node's row
    its part of them, the rows adding up to the campaign's."""
    fleet = three_nodes()
    c = fleet.campaign("traces")
    # gen-1 read 9 commits: 7,000 done of which 400 cut, 30 failed; its part 4,000/10/300.
    one = node_snapshot("gen-1", 9, [], counted(9, 7000, 30, 400, (4000, 10, 300)),
                        completed=4400, failed=10, truncated=350, rate_per_sec=2.0)
    # gen-2 read 10 (a commit more, of its own): the freshest count.
    two = node_snapshot("gen-2", 10, [], counted(10, 8000, 40, 420, (3000, 20, 100), 250),
                        completed=3700, failed=20, truncated=180, rate_per_sec=3.0)
    # gen-3 read fewer, and its own truncated went below zero in an older agent's way.
    three = node_snapshot("gen-3", 8, ["9"], counted(8, 6000, 25, 500, (1000, 10, 20)),
                          completed=1000, failed=10, truncated=-14, rate_per_sec=1.0)
    members = [Member("gen-1", "connected", one), Member("gen-2", "connected", two),
               Member("gen-3", "connected", three)]
    r = roll_up(fleet, c, members)
    assert (r.completed, r.failed, r.truncated, r.total) == (8000, 40, 420, 10_000)
    assert [(x.node, x.completed, x.failed, x.truncated, x.total) for x in r.rows] == [
        ("gen-1", 4000, 10, 300, 10_000), ("gen-2", 3000, 20, 100, 10_000),
        ("gen-3", 1000, 10, 20, 10_000)]
    assert sum(x.completed or 0 for x in r.rows) == r.completed
    assert [x.lost_lines for x in r.rows] == [0, 250, 0]
    assert any("gen-2 connected" in line and "250 lines in no commit" in line
               for line in human(r))
    assert "8,000 lines done, 40 failed, 420 truncated" in human(r)[0]
    # The same read count: the newer snapshot's.
    later = node_snapshot("gen-1", 10, [], counted(10, 8100, 40, 410, (4100, 10, 290)),
                          updated_at=two.progress.updated_at + 5)  # type: ignore[union-attr]
    r = roll_up(fleet, c, [Member("gen-1", "connected", later), *members[1:]])
    assert (r.completed, r.truncated) == (8100, 410)
    # A node whose agent counts no commits: its own figures, summed, until one does.
    old = node_snapshot("gen-1", 9, [], completed=4400, failed=10, truncated=350)
    r = roll_up(fleet, c, [Member("gen-1", "connected", old)])
    assert (r.completed, r.failed, r.truncated) == (4400, 10, 350)
    assert r.rows[0].completed == 4400 and r.rows[0].lost_lines is None
    r = roll_up(fleet, c, [Member("gen-1", "connected", old), *members[1:]])
    assert (r.completed, r.failed, r.truncated) == (8000, 40, 420)
    assert r.rows[0].completed == 4400  # its own, for want of its part


def test_a_node_that_cannot_reach_the_queue_or_runs_for_another_campaign_is_named() -> None:
    fleet = three_nodes()
    c = fleet.campaign("traces")
    snap = node_snapshot("gen-1", 1, [])
    assert snap.progress is not None and snap.progress.queue is not None
    snap.progress.queue.s3_error = "EndpointConnectionError: no route"
    snap.progress.campaign = "other"
    r = roll_up(fleet, c, [Member("gen-1", "connected", snap)])
    assert any("gen-1 cannot reach the queue: EndpointConnectionError" in w for w in r.warnings)
    assert any("gen-1 runs for campaign 'other'" in w for w in r.warnings)
    assert r.answered == 1 and not r.complete


def test_a_training_campaign_speaks_through_rank_0() -> None:
    nodes = [Node(name=n, run_dir=f"/r/{n}", local=True, role="train") for n in ("t-1", "t-2")]
    fleet = Fleet(nodes=nodes, campaigns=[Campaign("drafter", ["t-1", "t-2"])])
    c = fleet.campaign("drafter")
    rank0 = msgspec.convert(d.train_snapshot(), Snapshot)
    other = msgspec.convert(d.train_snapshot(status="failed"), Snapshot)
    r = roll_up(fleet, c, [Member("t-1", "connected", rank0), Member("t-2", "connected", other)])
    assert (r.role, r.step, r.total_steps, r.loss) == ("train", 6400, 20000, 1.8342)
    assert (r.eta_hours, r.slowest, r.rate_per_sec) == (9.2, "t-1", 48_210.0)
    assert r.statuses == {"running": 1, "failed": 1} and r.status == "running"
    assert [(s.node, s.place, s.status) for s in r.rows] == \
        [("t-1", "0/2", "running"), ("t-2", "1/2", "failed")]
    assert "step 6400/20000 loss 1.8342" in human(r)[0]
