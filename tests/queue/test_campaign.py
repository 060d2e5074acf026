"""One queue for many nodes, end to end: real engines (processes) on one campaign prefix in
the real SeaweedFS, each with its own simulators. Whatever happens to a node (killed, cut off
from S3, added late, slow at the tail) or to S3 itself, every index of the prompt set is
committed exactly once, done or failed, and verify proves it from the commits."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.queue.board import Board, Me
from agents.queue.layout import Layout
from agents.queue.union import read_union
from tests.engine.runs import write_prompts
from tests.queue.nodes import Node, check, make_node, prefix_for
from tests.servers.lax_s3 import start_lax_s3
from tests.servers.ports import wait_until
from tests.servers.s3 import S3Server, running_s3
from tests.servers.tcp_front import start_tcp_front

# Every wait is for a condition; these bound it on a loaded 2-core machine.
RUN_S = 240.0
ENV = {"FLEETDECK_S3_TIMEOUT_S": "3", "FLEETDECK_JOURNAL_INTERVAL_S": "1"}


@pytest.fixture
def own_s3() -> Iterator[S3Server]:
    with running_s3() as s3:
        yield s3


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[list[Node]]:
    nodes: list[Node] = []
    yield nodes
    for n in nodes:
        n.stop()


def _env(s3: S3Server) -> dict[str, str]:
    return {**s3.env(), **ENV}


def _queue(n: Node) -> dict[str, Any]:
    p = n.progress() or {}
    return p.get("queue") or {}


def _finish(nodes: list[Node]) -> None:
    for n in nodes:
        assert n.engine is not None
        rc = n.engine.wait(RUN_S)
        assert rc == 0, f"{n.name} exited {rc}:\n{n.logs()}"
        assert _queue(n).get("finished"), n.logs()


def _commits_by_node(s3: S3Server, prefix: str) -> Counter[str]:
    u = read_union(s3.client(), s3.bucket, prefix)
    return Counter(c.node for g in u.commits.values() for c in g.values())


def _exactly_once(s3: S3Server, prefix: str, lines: int) -> None:
    v = check(s3, prefix, deep=1.0)
    assert v.ok, v.problems
    assert v.done + v.failed == lines and v.committed == v.chunks


Figures = tuple[int, int, int]  # done (truncated ones included), failed, truncated


def _commit_objects(s3: S3Server, prefix: str) -> list[dict[str, Any]]:
    """Every commit object of every generation, as S3 holds it (boto3, not our reader)."""
    client = s3.client()
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket,
                                                                 Prefix=prefix + "commits/"):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=s3.bucket, Key=item["Key"])["Body"].read()
            out.append(json.loads(body))
    return out


def _truth(commits: list[dict[str, Any]]) -> tuple[Figures, dict[str, Figures]]:
    """The campaign's lines by its commits, each index from its highest generation, and each
    node's part (the indices whose commit is its own)."""
    final: dict[int, tuple[int, str, str]] = {}  # index -> (generation, node, state)
    for c in sorted(commits, key=lambda c: c["generation"]):
        cut = {i for a, b in c["truncated"] for i in range(a, b)}
        for a, b in c["done"]:
            final.update({i: (c["generation"], c["node"], "cut" if i in cut else "done")
                          for i in range(a, b)})
        for a, b in c["failed"]:
            final.update({i: (c["generation"], c["node"], "failed") for i in range(a, b)})

    def figures(states: list[str]) -> Figures:
        return (sum(s != "failed" for s in states), states.count("failed"), states.count("cut"))

    nodes = {node for _, node, _ in final.values()}
    return figures([s for _, _, s in final.values()]), {
        n: figures([s for _, node, s in final.values() if node == n]) for n in nodes}


def _own_current_cut(n: Node) -> int:
    """The node's own lines (its run dir's batches) that are current there (the highest
    attempt of their index) and cut at max_tokens."""
    current: dict[int, tuple[int, str]] = {}
    for path in sorted((n.run_dir / "completions").glob("completions_*")):
        for raw in path.read_bytes().splitlines():
            x = json.loads(raw)
            if x["index"] not in current or x.get("attempt", 1) > current[x["index"]][0]:
                current[x["index"]] = (x.get("attempt", 1), x["finish_reason"])
    return sum(f == "length" for _, f in current.values())


def _figures_are_the_commits(s3: S3Server, prefix: str, nodes: list[Node]) -> Figures:
    """Each finished node's count of the campaign is its commits', each index once, and its
    part is the indices its own commits hold; its own truncated count is its current lines
    that are cut, never below zero, whoever redid them."""
    commits = _commit_objects(s3, prefix)
    whole, parts = _truth(commits)
    for n in nodes:
        q = _queue(n)
        assert q["commits_counted"] == len(commits), (n.name, q)
        assert (q["lines_done"], q["lines_failed"], q["lines_truncated"]) == whole, (n.name, q)
        assert (q["done_here"], q["failed_here"], q["truncated_here"]) == \
            parts.get(n.name, (0, 0, 0)), (n.name, q)
        truncated = (n.progress() or {})["truncated"]
        assert truncated == _own_current_cut(n) >= 0, (n.name, truncated)
    return whole


def test_six_nodes_uneven_one_killed_mid_chunk_one_added_late(
        tmp_path: Path, queue_s3: S3Server, fleet: list[Node]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    bad = write_prompts(prompts, 900, bad_every=101)
    # Seconds per answer, about: the campaign lasts long enough for a node to join it.
    scales = [0.5, 0.7, 3.0, 0.6, 0.8]
    fleet += [make_node(tmp_path, f"n{k}", prompts, queue_s3, sims=1, time_scale=s,
                        lease_s=6.0, chunk_size=30) for k, s in enumerate(scales)]
    late = make_node(tmp_path, "n5", prompts, queue_s3, sims=1, time_scale=0.5, lease_s=6.0,
                     chunk_size=30)
    env = _env(queue_s3)
    slow, first = fleet[2], fleet[0]
    # The slow node and one other first, the rest once the late node has joined: started all
    # at once on a loaded machine, the others could take most of the queue before the slow
    # node held a chunk, or leave nothing for the late one.
    for n in (first, slow):
        n.start(env)
    fleet.append(late)
    # Killed mid-chunk: it holds a chunk and has written some of its lines.
    wait_until(lambda: _queue(slow).get("held") and (slow.progress() or {}).get("completed", 0)
               >= 5, RUN_S, "the slow node holds a chunk, part done")
    held = list(_queue(slow)["held"])
    assert slow.engine is not None
    slow.engine.kill()
    # Added mid-run: it claims work at once.
    assert (slow.progress() or {})["queue"]["committed"] < 30 // 2, "the campaign ran too fast"
    late.start(env)
    wait_until(lambda: _queue(late).get("committed_here", 0) >= 1, RUN_S,
               "the node added mid-run commits a chunk")
    for n in fleet:
        if n.engine is None:
            n.start(env)
    alive = [n for n in fleet if n is not slow]
    assert all(n.engine is not None for n in alive)
    _finish(alive)
    _exactly_once(queue_s3, prefix_for(tmp_path), 900)
    u = read_union(queue_s3.client(), queue_s3.bucket, prefix_for(tmp_path))
    # The chunk the killed node held was taken over past its term and committed by another.
    for name in held:
        c = u.commits[0][int(name)]
        assert c.node != "n2" and c.epoch >= 2, (name, c.node, c.epoch)
    assert sum(_queue(n).get("taken_over", 0) for n in alive) >= len(held)
    failed = {i for g in u.commits.values() for c in g.values()
              for a, b in c.failed for i in range(a, b)}
    assert failed == bad  # the malformed lines, and nothing else, failed
    assert _commits_by_node(queue_s3, prefix_for(tmp_path))["n5"] >= 1


def test_a_node_cut_off_from_s3_past_its_lease_keeps_working_and_its_late_commit_is_refused(
        tmp_path: Path, own_s3: S3Server, fleet: list[Node]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 120)
    front = start_tcp_front(own_s3.endpoint_url)
    try:
        cut = make_node(tmp_path, "cut", prompts, own_s3, sims=1, time_scale=0.3,
                        endpoint=front.url, lease_s=4.0, chunk_size=40,
                        concurrency_per_server=4)
        other = make_node(tmp_path, "other", prompts, own_s3, sims=1, time_scale=0.002,
                          lease_s=4.0, chunk_size=40)
        fleet += [cut, other]
        env = _env(own_s3)
        cut.start(env)
        wait_until(lambda: bool(_queue(cut).get("held")), RUN_S, "the node holds a chunk")
        held = int(_queue(cut)["held"][0])
        front.blackhole()
        other.start(env)
        board = Board(own_s3.client(), own_s3.bucket, prefix_for(tmp_path), Me("t", "t"), 4.0,
                      0.0)
        key = Layout(prefix_for(tmp_path)).commit(0, held)

        def committed_by_other() -> bool:
            c = board.read_commit(0, held)
            return c is not None and c.node == "other"

        wait_until(committed_by_other, RUN_S, f"the other node takes over {key} and commits it")
        # Cut off all along, the node went on generating its chunk.
        wait_until(lambda: (cut.progress() or {}).get("completed", 0) >= 20, RUN_S,
                   "the cut-off node keeps generating")
        front.restore()
        _finish([cut, other])
        assert _queue(cut)["lost"] >= 1, cut.logs()
        assert "commit refused, other" in cut.logs()
        _exactly_once(own_s3, prefix_for(tmp_path), 120)
        # The zombie's lines count nowhere in the campaign's figures; it says it lost them.
        whole = _figures_are_the_commits(own_s3, prefix_for(tmp_path), [cut, other])
        assert whole[0] + whole[1] == 120
        assert _queue(cut)["lost_lines"] >= 1, _queue(cut)
        assert board.read_commit(0, held).node == "other"  # type: ignore[union-attr]
    finally:
        front.close()


def test_the_tail_gets_a_backup_and_the_first_commit_wins(
        tmp_path: Path, queue_s3: S3Server, fleet: list[Node]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 200)
    fleet += [make_node(tmp_path, f"b{k}", prompts, queue_s3, sims=1, time_scale=s,
                        lease_s=60.0, chunk_size=20, concurrency_per_server=4)
              for k, s in enumerate([0.002, 0.002, 6.0])]
    env = _env(queue_s3)
    slow = fleet[2]
    # The slow node first, holding a chunk with a line done before the fast ones start:
    # started together on a loaded box, the fast ones took all ten chunks before its engine
    # was up (CI saw it); and its chunk then has lines to lose. At its pace (~0.3 lines/s)
    # the rest of the chunk takes about a minute, the window the fast ones have to start,
    # take the other nine chunks and commit a backup of it (~9 s here; at a third of this
    # pace the window was ~10 s, which a loaded box could miss).
    slow.start(env)
    wait_until(lambda: bool(_queue(slow).get("held"))
               and (slow.progress() or {}).get("completed", 0) >= 1, RUN_S,
               "the slow node holds a chunk, a line of it done")
    for n in fleet[:2]:
        n.start(env)
    _finish(fleet)
    _exactly_once(queue_s3, prefix_for(tmp_path), 200)
    assert sum(_queue(n).get("backups", 0) for n in fleet[:2]) >= 1, [n.logs() for n in fleet]
    # The slow node's chunk went to its backup: it lost the commit or dropped the chunk.
    assert _queue(slow).get("lost", 0) >= 1 or "committed by another node" in slow.logs()
    # Both copies wrote lines; only the winner's count, on every node's count of the campaign
    # (no index twice: the nodes' own lines add up to more than the campaign has).
    whole = _figures_are_the_commits(queue_s3, prefix_for(tmp_path), fleet)
    assert whole[0] + whole[1] == 200
    lost = [_queue(n)["lost_lines"] for n in fleet]
    assert sum(lost) >= 1, lost
    own = sum((n.progress() or {})["completed"] for n in fleet)
    assert own == whole[0] + sum(lost), (own, whole, lost)


def test_s3_killed_and_restarted_mid_run(tmp_path: Path, own_s3: S3Server,
                                         fleet: list[Node]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300)
    fleet += [make_node(tmp_path, f"s{k}", prompts, own_s3, sims=1, time_scale=0.05,
                        lease_s=20.0, chunk_size=30) for k in range(2)]
    env = _env(own_s3)
    for n in fleet:
        n.start(env)
    # Every node in the queue before S3 goes: an engine opening its queue probes S3 and
    # refuses to start without it (ci9: s1 started after the first commit, on a loaded box,
    # and met a dead S3 at its start, which is not what this test is about).
    wait_until(lambda: all(_queue(n) for n in fleet) and
               sum(_queue(n).get("committed_here", 0) for n in fleet) >= 1, RUN_S,
               "every node in the queue and a first commit")
    own_s3.kill()
    wait_until(lambda: any((n.progress() or {}).get("completed", 0) > 0 and
                           (_queue(n).get("s3_error") or (n.progress() or {}).get("s3_error"))
                           for n in fleet), RUN_S, "a node notices S3 is gone")
    own_s3.start()
    _finish(fleet)
    _exactly_once(own_s3, prefix_for(tmp_path), 300)


def test_a_store_that_ignores_conditional_writes_is_refused_at_start(
        tmp_path: Path, queue_s3: S3Server, fleet: list[Node]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 20)
    lax = start_lax_s3(queue_s3.endpoint_url, queue_s3.access_key, queue_s3.secret_key)
    try:
        node = make_node(tmp_path, "lax", prompts, queue_s3, sims=1, endpoint=lax.url)
        fleet.append(node)
        engine = node.start(_env(queue_s3))
        assert engine.wait(RUN_S) != 0
        out = engine.stderr()
        assert f"the S3 store at {lax.url} (bucket {queue_s3.bucket!r}) ignores If-None-Match" \
            in out, out
        assert not (node.run_dir / "completions").exists() or \
            not any((node.run_dir / "completions").glob("*.jsonl"))
    finally:
        lax.close()


def test_a_retry_generation_after_a_max_tokens_raise_redoes_exactly_the_truncated(
        tmp_path: Path, queue_s3: S3Server, fleet: list[Node]) -> None:
    """The truncation playbook on a campaign: answers cut at max_tokens 32, then generation 1
    over exactly the indices the commits mark truncated, at max_tokens 4096; the nodes run it
    when resumed, and each index's data comes from its highest committing generation."""
    from agents.queue.retry import RetryRefused, new_generation
    from agents.queue.union import lines

    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 120)
    fleet += [make_node(tmp_path, f"r{k}", prompts, queue_s3, sims=1, time_scale=0.002,
                        lease_s=20.0, chunk_size=30, max_tokens=32) for k in range(2)]
    cutter, redoer = fleet[-2:]
    env = _env(queue_s3)
    # Generation 0 on one node and generation 1 on the other, so every index is redone on
    # another node than the one that cut it: left to the scheduling, one node could take
    # every chunk of both generations and the case would go untested.
    cutter.start(env)
    _finish([cutter])
    prefix = prefix_for(tmp_path)
    client = queue_s3.client()
    first = read_union(client, queue_s3.bucket, prefix)
    assert {c.node for c in first.commits[0].values()} == {cutter.name}
    cut = {i for c in first.commits[0].values() for a, b in c.truncated for i in range(a, b)}
    assert len(cut) > 60  # the simulator's answers run far past 32 tokens
    gen = new_generation(client, queue_s3.bucket, prefix, "truncated", 4096, "test")
    assert gen is not None and gen.generation == 1
    assert {i for ch in gen.chunks for a, b in ch for i in range(a, b)} == cut
    with pytest.raises(RetryRefused, match="not yet committed"):
        new_generation(client, queue_s3.bucket, prefix, "truncated", 8192, "test")
    # A node that joins at generation 1 runs it; the cutter, resumed after, finds it done.
    redoer.start(env)
    _finish([redoer])
    cutter.start(env)
    _finish([cutter])
    _exactly_once(queue_s3, prefix, 120)
    u = read_union(client, queue_s3.bucket, prefix)
    final = u.final()
    assert {i for i, (g, _, _) in final.items() if g == 1} == cut
    assert {c.node for c in u.commits[1].values()} == {redoer.name}
    still = {i for c in u.commits[1].values() for a, b in c.truncated for i in range(a, b)}
    assert len(still) < len(cut) // 4, "at 4096 tokens most answers end on their own"
    got = dict(lines(client, queue_s3.bucket, prefix))
    assert sorted(got) == list(range(120))
    for i in cut:
        line = json.loads(got[i])
        assert line["attempt"] == 2 and line["max_tokens"] == 4096
    # Each index once, from generation 1 where it was redone on the other node: each node's
    # own figures are its commits', the cutter's truncated count no longer holding the redone.
    whole = _figures_are_the_commits(queue_s3, prefix, fleet)
    assert whole == (120, 0, len(still))


def test_a_node_given_back_early_is_seen_by_any_console_through_the_queue(
        tmp_path: Path, queue_s3: S3Server, fleet: list[Node],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node stopped mid-chunk cannot be given back while its chunk has no commit; once
    another node has taken the chunk over and committed it, its agent writes the given-back
    record, and another node's `queue_status` (what any console asks) names it."""
    from agents.queue import node as queue_node
    from console.queue.verbs import given_back_of

    for k, v in queue_s3.env().items():
        monkeypatch.setenv(k, v)  # the agent's calls, made here, use the node's credentials
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 120)
    early = make_node(tmp_path, "early", prompts, queue_s3, sims=1, time_scale=1.0,
                      lease_s=4.0, chunk_size=30)
    stays = make_node(tmp_path, "stays", prompts, queue_s3, sims=1, time_scale=0.01,
                      lease_s=4.0, chunk_size=30)
    fleet += [early, stays]
    env = _env(queue_s3)
    early.start(env)
    wait_until(lambda: bool(_queue(early).get("held")), RUN_S, "the early node holds a chunk")
    assert early.engine is not None
    early.engine.kill()
    with pytest.raises(queue_node.NotAQueueRun, match="taken by this node, not committed"):
        queue_node.give_back(early.run_dir)
    stays.start(env)
    _finish([stays])
    record = queue_node.give_back(early.run_dir)
    assert record["node"] == "early"
    seen = queue_node.status(stays.run_dir)
    assert given_back_of(seen) == frozenset({"early"})
    assert seen["generations"][0]["committed"] == seen["generations"][0]["chunks"] == 4
    _exactly_once(queue_s3, prefix_for(tmp_path), 120)
