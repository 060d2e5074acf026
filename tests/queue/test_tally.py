"""The campaign's figures a node keeps from the commit objects it reads (agents/queue/tally.py)
against the union's own rule (`Union.final`: each index from its highest committing
generation), whatever order the commits are read in; and each node's part of them."""

from __future__ import annotations

import itertools
import random
import time

from agents.queue import records as rec
from agents.queue.ranges import Ranges, expand, to_ranges
from agents.queue.tally import Tally
from agents.queue.union import Union

LINES = 40


def commit(g: int, n: int, node: str, indices: list[int], failed: set[int],
           cut: set[int]) -> rec.Commit:
    done = [i for i in indices if i not in failed]
    return rec.Commit(generation=g, chunk=n, node=node, run_id=f"run-{node}", epoch=1,
                      started_at=time.time(), committed_at=time.time(), done=to_ranges(done),
                      failed=to_ranges(i for i in indices if i in failed),
                      truncated=to_ranges(i for i in done if i in cut), attempt=g + 1,
                      batches=[rec.BatchPart(key=f"b/{node}/{g}-{n}", sha256="", size=0,
                                             indices=to_ranges(done))])


def campaign() -> list[rec.Commit]:
    """Generation 0 in 4 chunks over nodes a and b; generation 1 redoes what it cut, on the
    other node than the one that cut it as often as not; generation 2 redoes what failed."""
    rng = random.Random(7)
    out: list[rec.Commit] = []
    final: dict[int, str] = {}
    for n in range(4):
        idx = list(range(n * 10, n * 10 + 10))
        failed = set(rng.sample(idx, 2))
        cut = set(rng.sample([i for i in idx if i not in failed], 4))
        out.append(commit(0, n, "ab"[n % 2], idx, failed, cut))
        final.update({i: "failed" if i in failed else "cut" if i in cut else "done"
                      for i in idx})
    for g, why in ((1, "cut"), (2, "failed")):
        picked = sorted(i for i, s in final.items() if s == why)
        for n, start in enumerate(range(0, len(picked), 5)):
            idx = picked[start:start + 5]
            failed = {idx[0]} if g == 1 else set()
            cut = {idx[-1]}
            out.append(commit(g, n, "ba"[n % 2], idx, failed, cut))
            final.update({i: "failed" if i in failed else "cut" if i in cut else "done"
                          for i in idx})
    return out


def figures(commits: list[rec.Commit], node: str) -> tuple[tuple[int, int, int], ...]:
    """(done, failed, truncated) of the campaign and of `node`'s part, by Union.final."""
    pin = rec.CampaignPin(campaign="c", prompts_sha256="0" * 64, prompts_lines=LINES,
                          chunk_size=10, model=None, sampling={}, chat_template_kwargs={},
                          created_at=0.0, created_by="t")
    by_gen: dict[int, dict[int, rec.Commit]] = {}
    for c in commits:
        by_gen.setdefault(c.generation, {})[c.chunk] = c
    u = Union(pin, by_gen, {g: len(v) for g, v in by_gen.items()})
    cut = {(c.generation, i) for c in commits for i in expand(c.truncated)}
    owner = {(c.generation, i): c.node for c in commits
             for i in itertools.chain(expand(c.done), expand(c.failed))}
    out = []
    for mine in (None, node):
        keep = [(i, g, s) for i, (g, s, _) in u.final().items()
                if mine is None or owner[(g, i)] == mine]
        out.append((sum(s == "done" for _, _, s in keep), sum(s == "failed" for _, _, s in keep),
                    sum((g, i) in cut for i, g, _ in keep)))
    return tuple(out)


def test_the_tally_is_the_unions_rule_in_any_order_of_reading() -> None:
    commits = campaign()
    want = figures(commits, "a")
    assert want[0][0] + want[0][1] == LINES and want[1] != (0, 0, 0)
    rng = random.Random(1)
    for _ in range(30):  # a listing read in bits: a retry's commit before the one it redoes
        order = commits[:]
        rng.shuffle(order)
        t = Tally(LINES, "a")
        for c in order:
            assert t.add(c)
            assert t.campaign.done + t.campaign.failed <= LINES
            assert min(t.here.done, t.here.failed, t.here.truncated) >= 0
        assert not t.add(order[0])  # each commit counted once
        got = ((t.campaign.done, t.campaign.failed, t.campaign.truncated),
               (t.here.done, t.here.failed, t.here.truncated))
        assert got == want and t.commits == len(commits)


def test_a_retry_on_another_node_moves_the_index_out_of_the_first_nodes_part() -> None:
    cut_idx: Ranges = [(0, 3)]
    first = commit(0, 0, "a", list(range(10)), set(), set(expand(cut_idx)))
    retry = commit(1, 0, "b", [0, 1, 2], {2}, set())
    t = Tally(10, "a")
    t.add(first)
    assert (t.campaign.done, t.campaign.truncated, t.here.truncated) == (10, 3, 3)
    t.add(retry)
    assert (t.campaign.done, t.campaign.failed, t.campaign.truncated) == (9, 1, 0)
    assert (t.here.done, t.here.failed, t.here.truncated) == (7, 0, 0)
    other = Tally(10, "b")
    other.add(retry)
    other.add(first)  # read after the retry that redid three of its indices
    assert (other.here.done, other.here.failed, other.campaign.done) == (2, 1, 9)
