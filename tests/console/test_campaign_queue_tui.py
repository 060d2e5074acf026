"""A queue campaign driven from the TUI through Pilot: two local nodes (each its own run dir,
spec and simulated SGLang server) sharing one work queue on the real SeaweedFS S3 server.
`L` on the campaign row launches it. Once it is done with answers cut at max_tokens, the
truncation playbook on the campaign row: `m` raises max tokens on every node, then `R` and
`truncated` make generation 1 over exactly the cut indices, at the raised limit, which both
nodes (resumed) run and commit.

What the queue holds is read here with boto3 from the campaign's prefix (the commit objects,
the retry generation's record, the batch lines), never from the console's own summary; the
figures on screen are checked against it: each index once, from the commit that won it and
its highest generation, with the tail's backup copies on (their losers' lines count nowhere)
and retried indices redone on whichever node takes them."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agents.rundir.schema import Progress
from console.fleet import Campaign, ConsoleSettings, Fleet, Node
from console.queue.rollup import from_state
from console.tui.app import FleetdeckApp
from console.tui.screens.campaign import CampaignScreen
from console.tui.screens.fleet import FleetScreen
from console.tui.widgets import figures as f
from console.tui.widgets.prompt import ValueModal
from console.tui.widgets.retry import RetryModal
from tests.console.conftest import agent, on_screen, until
from tests.console.screen import Recorder, progress, screen_text
from tests.console.test_actions_live import answer_value, confirm
from tests.engine.runs import write_prompts, write_spec
from tests.plugins.supervised import kill_run
from tests.queue.prefix import PrefixReader, indices, union
from tests.servers.ports import kill_pid, wait_until
from tests.servers.s3 import S3Server, running_s3
from tests.simserver import FAST_ARGS, SimHandle, start_sim

SIZE = (160, 48)
RUN_S = 180.0  # every wait is for a condition; this bounds it on a loaded 2-core machine
NODES = ("gen-1", "gen-2")
LINES = 120
CHUNK = 12
CHUNKS = -(-LINES // CHUNK)  # generation 0's
LOW, HIGH = 64, 1024  # the specs' max_tokens, and the raised one
# Answers with a median of 56 tokens: at max_tokens 64 a good share is cut ("length").
ANSWERS = ("--answer-median", "56")
# The engines' figures and journal often, S3 calls bounded (inherited through the agent by
# the supervisor and its engine).
ENGINE_ENV = {"FLEETDECK_S3_TIMEOUT_S": "5", "FLEETDECK_JOURNAL_INTERVAL_S": "1",
              "FLEETDECK_PROGRESS_INTERVAL_S": "0.2"}


@dataclass
class Queue(PrefixReader):
    """The campaign's prefix, read with boto3."""

    s3: S3Server
    prefix: str


def final(*generations: dict[int, dict[str, Any]]) -> dict[int, tuple[str, str]]:
    """index -> (the node whose commit holds it, done | cut | failed), from the highest
    generation that committed it."""
    out: dict[int, tuple[str, str]] = {}
    for commits in generations:
        for c in commits.values():
            cut = indices(c["truncated"])
            out.update({i: (c["node"], "cut" if i in cut else "done") for i in indices(c["done"])})
            out.update({i: (c["node"], "failed") for i in indices(c["failed"])})
    return out


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def make_fleet(tmp_path: Path, s3: S3Server, prefix: str, sims: dict[str, SimHandle]) -> Fleet:
    """Each node local, with its own run dir, prompts file (the same lines) and spec: a
    `[queue]` section on the campaign's prefix, small chunks and a short lease; backup copies
    of slow tail chunks at the default `backup_after`."""
    env = {**s3.env(), **ENGINE_ENV}
    if os.environ.get("PYTHONPATH"):  # the code under test, in the agent and its children
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    command = " ".join(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m",
                        "agents.cli"])
    nodes = []
    for name in NODES:
        folder = tmp_path / name
        folder.mkdir()
        prompts = folder / "prompts.jsonl"
        write_prompts(prompts, LINES)
        spec = write_spec(folder / "run.toml", prompts, [sims[name].url], s3=s3,
                          max_tokens=LOW, batch_size=10, concurrency_per_server=4,
                          request_timeout_s=60.0)
        text = spec.read_text().replace('prefix = "runs/test/"', f'prefix = "{prefix}"')
        text = text.replace('name = "test-run"', f'name = "{name}"')
        spec.write_text(text + f"\n[queue]\nchunk_size = {CHUNK}\nlease_s = 6.0\npoll_s = 0.5\n")
        nodes.append(Node(name=name, run_dir=str(folder / "run"), local=True, agent=command,
                          spec=str(spec)))
    return Fleet(nodes=nodes, campaigns=[Campaign("traces", list(NODES))],
                 console=ConsoleSettings(bell=False), source="test-fleet")


async def test_raise_max_tokens_then_retry_truncated_on_a_queue_campaign_row(
        tmp_path: Path) -> None:
    with running_s3() as s3:
        sims = {name: start_sim(tmp_path, *FAST_ARGS, *ANSWERS, "--seed", str(k), name=name,
                                wait_ready=False) for k, name in enumerate(NODES)}
        fleet: Fleet | None = None
        try:
            for name, h in sims.items():
                wait_until(functools.partial(_ready, h.url), RUN_S, f"{name}'s simulator",
                           h.proc)
            prefix = f"campaigns/{tmp_path.name}/"
            fleet = make_fleet(tmp_path, s3, prefix, sims)
            await playbook(fleet, Queue(s3, prefix))
        finally:
            for n in fleet.nodes if fleet is not None else []:
                kill_run(Path(n.run_dir))
            for h in sims.values():
                kill_pid(h.proc)


async def playbook(fleet: Fleet, q: Queue) -> None:
    rec = Recorder()
    app = FleetdeckApp(fleet)
    run_dirs = {n.name: n.run_dir for n in fleet.nodes}

    def finished(chunks: int) -> Callable[[], bool]:
        """Both nodes done, each having last seen `chunks` chunks, all committed."""
        def check(p: Progress | None) -> bool:
            return p is not None and p.status == "done" and p.queue is not None and \
                p.queue.chunks == chunks and p.queue.committed == chunks
        return lambda: all(check(progress(app, n)) for n in NODES)

    def campaign_row() -> str:
        return next((x for x in screen_text(app).splitlines() if "▸ traces" in x), "")

    def bar() -> str:
        return screen_text(app).splitlines()[0]

    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await until(pilot, lambda: "2/2 live" in screen_text(app), 120, "the campaign row")
        assert app.current_campaign() == "traces" and app.current_node() is None

        # 1. L on the campaign row: every node passes the check, then every node starts and
        # takes chunks from the one queue until it is empty.
        await pilot.press("L")
        await confirm(pilot, app, "Launch campaign traces on 2 nodes?")
        await until(pilot, lambda: rec.has("traces: launch: all 2 nodes"), RUN_S,
                    "the launch's notification")
        assert rec.has("gen-1: launch: started") and rec.has("gen-2: launch: started")
        await until(pilot, finished(CHUNKS), RUN_S, "generation 0 done on both nodes")
        gen0 = q.commits(0)
        assert sorted(gen0) == list(range(CHUNKS))
        cut, failed, done = (union(gen0, k) for k in ("truncated", "failed", "done"))
        assert 0 < len(cut) < len(done) and len(done) + len(failed) == LINES
        # The figures on screen are the commits': the row's lines done, the campaign screen's
        # chunks and truncation, each node's truncated.
        await until(pilot, lambda: from_state(app.state, fleet.campaigns[0]).truncated
                    == len(cut), RUN_S, "the truncated count")
        lines_done = f"{f.pct(len(done), LINES)} {f.si(len(done))}/{f.si(LINES)}"
        await until(pilot, lambda: " done " in (row := campaign_row()) and lines_done in row,
                    120, f"the campaign row done with {lines_done}")
        await pilot.press("enter")
        await until(pilot, lambda: on_screen(app, CampaignScreen), 120, "the campaign screen")
        await until(pilot, lambda: f"done · {CHUNKS}/{CHUNKS} chunks (100.0%)" in bar(), 120,
                    "generation 0's chunks in the bar")
        assert f"truncated {f.pct(len(cut), len(done))}" in bar(), bar()
        r = from_state(app.state, fleet.campaigns[0])
        assert {x.node: x.truncated for x in r.rows} == \
            {n: len(union(gen0, "truncated", n)) for n in NODES}
        await pilot.press("escape")
        await until(pilot, lambda: on_screen(app, FleetScreen), 120, "the fleet screen")
        assert app.current_campaign() == "traces"

        # 2. The playbook on the campaign row: max tokens raised on every node...
        await pilot.press("m")
        modal = await until(pilot, lambda: on_screen(app, ValueModal), 120, "the value prompt")
        assert modal.note == f"now {LOW} on gen-1, {LOW} on gen-2", modal.note
        await answer_value(pilot, app, str(HIGH))
        await pilot.press("enter")
        await until(pilot, lambda: rec.has(f"traces: max_tokens {HIGH}: all 2 nodes"), RUN_S,
                    "max_tokens raised on both")
        # ...but gen-2's own limit put back to the spec's: a node the raise did not reach (as
        # a node joining the campaign now would be). The retry generation carries the raised
        # limit; without it gen-2 ran its share of the retry at 64 and cut the same answers.
        r2 = await asyncio.to_thread(agent, "max-tokens", run_dirs["gen-2"], str(LOW))
        assert r2.returncode == 0, r2.stderr
        # ...then retry truncated: one node makes generation 1, every node is resumed.
        await pilot.press("R")
        retry = await until(pilot, lambda: on_screen(app, RetryModal), 120, "the retry choice")
        assert retry.detail == f"failed now {len(failed)}, truncated {len(cut)} across its " \
            f"nodes; truncated ones run again at max_tokens {HIGH}", retry.detail
        await pilot.press("t")
        await until(pilot, lambda: rec.has("traces: resume for the new generation: all 2 nodes"),
                    RUN_S, "both nodes resumed")
        assert rec.has("gen-1: resumed") and rec.has("gen-2: resumed")
        gen = json.loads(q.read(f"{q.prefix}gens/gen-0001.json"))
        assert (gen["generation"], gen["why"], gen["max_tokens"]) == (1, "truncated", HIGH)
        assert set().union(*(indices(ch) for ch in gen["chunks"])) == cut
        assert sum(len(indices(ch)) for ch in gen["chunks"]) == len(cut)  # each index once
        assert all(len(indices(ch)) <= CHUNK for ch in gen["chunks"])
        assert rec.has(f"traces: retry truncated: generation 1: {len(cut)} truncated indices "
                       f"in {len(gen['chunks'])} chunks at max_tokens {HIGH}"), rec.notes

        # 3. Generation 1 committed in full, each retried index once, at the raised limit.
        total = CHUNKS + len(gen["chunks"])
        await until(pilot, finished(total), RUN_S, "generation 1 done on both nodes")
        gen1 = q.commits(1)
        assert sorted(gen1) == list(range(len(gen["chunks"])))
        assert all(c["attempt"] == 2 for c in gen1.values())
        assert union(gen1, "done") | union(gen1, "failed") == cut
        redone: list[tuple[str, dict[str, Any]]] = []  # (the node, a line it committed)
        for c in gen1.values():
            for part in c["batches"]:
                taken = indices(part["indices"])
                redone += [(c["node"], x) for raw in q.read(part["key"]).splitlines()
                           if (x := json.loads(raw))["index"] in taken and x["attempt"] == 2]
        assert sorted(x["index"] for _, x in redone) == sorted(cut)
        limits = {(n, x["max_tokens"]) for n, x in redone}
        assert {mt for _, mt in limits} == {HIGH}, sorted(limits)
        still = union(gen1, "truncated")
        assert len(still) < len(cut) // 2, "at 1024 tokens most answers end on their own"

        # The campaign screen: every chunk of both generations committed, truncation down to
        # what generation 1 still cut.
        await pilot.press("enter")
        await until(pilot, lambda: on_screen(app, CampaignScreen), 120, "the campaign screen")
        await until(pilot, lambda: f"done · {total}/{total} chunks (100.0%)" in bar(), 120,
                    "both generations' chunks in the bar")
        # Each index once, from generation 1 where it was redone: lines done, failed and
        # truncated on the bar, the row and each node's line are the commits'.
        now = final(gen0, gen1)
        states = [s for _, s in now.values()]
        done_n, failed_n = sum(s != "failed" for s in states), states.count("failed")
        assert states.count("cut") == len(still) and done_n + failed_n == LINES
        parts = {n: sum(x == (n, "cut") for x in now.values()) for n in NODES}
        await until(pilot, lambda: (lambda r: (r.completed, r.failed, r.truncated) ==
                                    (done_n, failed_n, len(still)) and
                                    {x.node: x.truncated for x in r.rows} == parts)(
            from_state(app.state, fleet.campaigns[0])), RUN_S, "generation 1's figures")
        r = from_state(app.state, fleet.campaigns[0])
        assert {x.node: x.completed for x in r.rows} == \
            {n: sum(x[0] == n and x[1] != "failed" for x in now.values()) for n in NODES}
        assert all(min(x.completed or 0, x.failed or 0, x.truncated or 0) >= 0 for x in r.rows)
        assert f"{f.si(done_n)} lines" in bar() and f"failed {f.num(failed_n)}" in bar(), bar()
        assert f"truncated {f.pct(len(still), done_n)}" in bar(), bar()
        # (Which node redoes which index is the scheduling's here; the case of an index
        # redone on another node than the one that cut it, which broke the nodes' own counts,
        # is forced in tests/queue/test_campaign.py's retry test.)
        await pilot.press("escape")
        await until(pilot, lambda: on_screen(app, FleetScreen), 120, "the fleet screen")
        lines_done = f"{f.pct(done_n, LINES)} {f.si(done_n)}/{f.si(LINES)}"
        await until(pilot, lambda: lines_done in campaign_row(), 120,
                    f"the campaign row with {lines_done}")
