"""Moving the tail (issue 15, item 4): `fleetdeck rebalance CAMPAIGN --yes` moves part of a
slow shard's to-do to a node that is done: the slow node cedes (journaled), the idle one adopts
the same ranges under the same id (journaled). Real processes: two agents over the real sshd,
each with its own run dir and simulators (one node's slow), SeaweedFS S3; kill -9 of either
node at its step and of the console between the steps loses nothing and sends nothing twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from botocore.exceptions import ClientError

from agents.engine.ownership import expand
from agents.rundir.schema import Snapshot
from console.campaign import Member
from console.campaign_rebalance import WARMUP_S, move_id, plan, target_of
from console.cli import main as cli_main
from console.fleet import Campaign, Fleet, Node, load_fleet
from console.tui.app import FleetdeckApp
from tests.console import data as d
from tests.console.conftest import until
from tests.console.screen import Recorder
from tests.console_headless.test_headless_ssh import AGENT, fleetdeck, node_toml
from tests.engine.runs import write_prompts, write_spec
from tests.plugins.supervised import agent, kill_run, rpc_status, wait_status
from tests.servers.ports import wait_until
from tests.servers.s3 import S3Server
from tests.servers.sshd import SshServer

# -- the plan (pure) ------------------------------------------------------------------------------


def fleet_of(n: int) -> tuple[Fleet, Campaign]:
    names = [f"gen-{i}" for i in range(n)]
    c = Campaign("traces", names)
    return Fleet(nodes=[Node(name=x, run_dir=f"/r/{x}", local=True) for x in names],
                 campaigns=[c], source="fleet.toml"), c


def member(name: str, shard: str, status: str = "running", total: int = 1000,
           completed: int = 0, failed: int = 0, rate: float = 0.0, elapsed_h: float = 0.0,
           cedes: tuple[tuple[str, int], ...] = (), adopts: tuple[str, ...] = (),
           came_from: str = "x") -> Member:
    own = {"cedes": [{"id": i, "count": n, "time": d.NOW} for i, n in cedes],
           "adopts": [{"id": i, "count": 1, "time": d.NOW, "node": came_from, "shard": "0/2"}
                      for i in adopts]}
    p = d.progress(run="traces", shard=shard, campaign="traces", status=status, total=total,
                   completed=completed, failed=failed, rate_per_sec=rate,
                   elapsed_hours=elapsed_h, ownership=own)
    snap = msgspec.convert(d.generate_snapshot(run="traces", status=status, progress=p,
                                               alerts=[]), Snapshot)
    return Member(name, "connected", snap)


def test_the_idle_node_takes_a_share_of_the_slow_ones_remaining_by_rate() -> None:
    fleet, c = fleet_of(2)
    slow = member("gen-0", "0/2", total=1000, completed=200, failed=0, rate=1.0)
    idle = member("gen-1", "1/2", status="done", total=1000, completed=990, failed=10,
                  rate=3.0)
    p = plan(fleet, c, [slow, idle], 1_700_000_000_000, min_left=100)
    (m,) = p.moves
    assert (m.slow, m.idle, m.count) == ("gen-0", "gen-1", 600)  # 800 left x 3 / (1 + 3)
    assert m.id == "rb-traces-1700000000000-0to1" == move_id(c, "gen-0", "gen-1",
                                                             1_700_000_000_000)
    assert target_of(c, m.id, "gen-0") == "gen-1" and not p.readopts
    # --max caps a move; rates not known: half; a finished node's rate is its mean.
    assert plan(fleet, c, [slow, idle], 1, 100, most=50).moves[0].count == 50
    # A node whose engine has no rate yet (its first progress, or nothing done in its first
    # seconds) is warming up and gives nothing: it may be the fast node the last move's adopt
    # restarted. Once it has run WARMUP_S with nothing done (stalled), it gives half.
    done_500 = member("gen-1", "1/2", status="done", total=500, completed=500)
    for young in (member("gen-0", "0/2", completed=200),
                  member("gen-0", "0/2", elapsed_h=5 / 3600)):
        assert plan(fleet, c, [young, done_500], 1, 100).empty
    stalled = member("gen-0", "0/2", elapsed_h=WARMUP_S / 3600)
    assert plan(fleet, c, [stalled, done_500], 1, 100).moves[0].count == 500
    # A resumed engine's mean (every engine's completions over this one's time) is high: a
    # fast node restarted by an adopt gives back at most a sliver.
    resumed = member("gen-0", "0/2", completed=900, elapsed_h=1 / 3600)
    slow_done = member("gen-1", "1/2", status="done", total=500, completed=500,
                       elapsed_h=500 / 3600)  # one a second
    assert plan(fleet, c, [resumed, slow_done], 1, 10).empty
    mean = member("gen-1", "1/2", status="done", total=1000, completed=1000,
                  elapsed_h=1000 / 3 / 3600)
    assert plan(fleet, c, [slow, mean], 1, 100).moves[0].count == 600
    # Not enough left (--min), nobody idle, a paused slow node: nothing moves.
    assert plan(fleet, c, [slow, idle], 1, 800).empty
    busy = member("gen-1", "1/2", total=1000, completed=10, rate=3.0)
    assert plan(fleet, c, [slow, busy], 1, 100).empty
    paused = member("gen-0", "0/2", status="paused", completed=200, rate=1.0)
    assert plan(fleet, c, [paused, idle], 1, 100).empty


def test_idle_nodes_help_the_slow_node_that_would_finish_last() -> None:
    fleet, c = fleet_of(4)
    members = [member("gen-0", "0/4", completed=0, rate=1.0),  # 1000 left: last by far
               member("gen-1", "1/4", completed=900, rate=1.0),  # 100 left
               member("gen-2", "2/4", status="done", completed=1000, rate=1.0),
               member("gen-3", "3/4", status="done", completed=1000, rate=1.0)]
    p = plan(fleet, c, members, 7, 50)
    # Each idle node goes where the campaign's end is: both help gen-0, a third each.
    assert sorted((m.slow, m.idle, m.count) for m in p.moves) == [
        ("gen-0", "gen-2", 333), ("gen-0", "gen-3", 333)]
    assert len({m.id for m in p.moves}) == 2


def test_a_cede_nobody_adopted_is_finished_first_on_the_node_its_id_names() -> None:
    fleet, c = fleet_of(3)
    rb = move_id(c, "gen-0", "gen-2", 5)
    members = [member("gen-0", "0/3", completed=100, rate=1.0,
                      cedes=((rb, 40), ("manual-1", 7), ("old", 3))),
               member("gen-1", "1/3", status="done", completed=1000, rate=5.0),
               member("gen-2", "2/3", completed=100, rate=1.0, adopts=("old",))]
    p = plan(fleet, c, members, 9, 100)
    # The rebalance cede goes where its move meant it (gen-2 may hold it in flight), the
    # other to the idlest node; "old" is adopted already. Its adopter takes no new move.
    assert [(r.id, r.ceder, r.count, r.to) for r in p.readopts] == [
        (rb, "gen-0", 40, "gen-2"), ("manual-1", "gen-0", 7, "gen-1")]
    assert p.moves == []
    assert target_of(c, "rb-traces-1-1to2", "gen-0") is None  # K is not the node that ceded
    assert target_of(c, "rb-traces-1-0to7", "gen-0") is None  # no such node


def test_a_silent_node_is_left_out_and_a_cede_it_may_hold_waits() -> None:
    fleet, c = fleet_of(4)
    for_gen3 = move_id(c, "gen-0", "gen-3", 5)
    for_gen1 = move_id(c, "gen-0", "gen-1", 6)
    members = [member("gen-0", "0/4", completed=0, rate=1.0,
                      cedes=(("manual-1", 10), (for_gen3, 20), (for_gen1, 30))),
               member("gen-1", "1/4", status="done", completed=1000, rate=1.0),
               member("gen-2", "2/4", status="done", completed=1000, rate=1.0),
               Member("gen-3", "unreachable", None, "connection refused")]
    p = plan(fleet, c, members, 1, 10)
    assert not p.answered
    # gen-3 may hold the adopt of manual-1, and the move for_gen3 was for it: both wait. The
    # move for gen-1 is adopted there; a new move between two nodes that answer is safe.
    assert [(r.id, r.to) for r in p.readopts] == [(for_gen1, "gen-1")]
    assert [(m.slow, m.idle) for m in p.moves] == [("gen-0", "gen-2")]
    assert any("gen-3 did not answer" in n and "left out" in n for n in p.notes)
    assert any(n.startswith("cede manual-1 of gen-0 (10 indices) waits") and
               "may have adopted it" in n for n in p.notes)
    assert any(n.startswith(f"cede {for_gen3} of gen-0 (20 indices) waits") and
               "gen-3, the node it was for, did not answer" in n for n in p.notes)


def test_a_silent_node_whose_shard_was_reassigned_holds_nothing_back() -> None:
    fleet, c = fleet_of(3)
    members = [member("gen-0", "0/3", completed=0, rate=1.0),
               member("gen-1", "1/3", status="done", completed=1000, rate=5.0,
                      adopts=("reassign-s02of03",), came_from="gen-2"),
               Member("gen-2", "unreachable", None, "connection refused")]
    p = plan(fleet, c, members, 1, 10)
    assert p.answered and [(m.slow, m.idle) for m in p.moves] == [("gen-0", "gen-1")]
    assert any("gen-2 did not answer and its shard was reassigned" in n for n in p.notes)
    # A rebalance adopt from a silent node is no reassign: it is still missing.
    members[1] = member("gen-1", "1/3", status="done", completed=1000, rate=5.0,
                        adopts=(move_id(c, "gen-2", "gen-1", 1),), came_from="gen-2")
    assert not plan(fleet, c, members, 1, 10).answered


def test_a_stopped_node_with_work_is_named_not_fed() -> None:
    fleet, c = fleet_of(2)
    members = [member("gen-0", "0/2", completed=0, rate=1.0),
               member("gen-1", "1/2", status="failed", completed=900, rate=5.0)]
    p = plan(fleet, c, members, 1, 10)
    assert p.empty
    assert any("gen-1 owns 100 indices not done and is failed" in n and
               "fleetdeck resume gen-1" in n for n in p.notes)


# -- two nodes over the real sshd ----------------------------------------------------------------

FAST_SIM = ("--time-scale", "0.01")
SLOW_SIM = ("--time-scale", "2.0")  # about two seconds an answer: a tail that outlasts each step


@dataclass
class Nodes:
    tmp: Path
    sshd: SshServer
    s3: S3Server
    specs: dict[str, Path]
    run_dirs: dict[str, Path]
    fleet: Path
    prompts: int

    def write_fleet(self, env: dict[str, dict[str, str]] | None = None,
                    rebalance: str = "off") -> None:
        """The fleet file; `env` adds to a node's agent environment (a crash point: the
        supervisor the agent starts inherits it)."""
        text = ""
        for name, spec in self.specs.items():
            extra = {**self.s3.env(), **(env or {}).get(name, {})}
            cmd = " ".join(["env", *(f"{k}={v}" for k, v in extra.items()), AGENT])
            text += node_toml(name, self.sshd, self.run_dirs[name], agent_cmd=cmd)
            text += f'spec = "{spec}"\n'
        text += ('[[campaigns]]\nname = "traces"\nnodes = ["gen-1", "gen-2"]\n'
                 f'rebalance = "{rebalance}"\n')
        self.fleet.write_text(text)

    def deck(self, *args: str, timeout: float = 180, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
        """`fleetdeck --fleet FLEET ARGS`, with `env` over this environment (the console's)."""
        if env is None:
            return fleetdeck(self.fleet, *args, timeout=timeout)
        return subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(self.fleet),
                               *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **env})

    def batches(self) -> dict[str, dict[int, int]]:
        """Each node's completion lines by index: how many lines each index has."""
        out: dict[str, dict[int, int]] = {}
        for name, rd in self.run_dirs.items():
            seen: dict[int, int] = {}
            # The open batch (`.partial`) too: a node not yet finished shows as one, not as
            # lines missing.
            for path in sorted((rd / "completions").glob("completions_*.jsonl*")):
                for raw in path.read_text().splitlines():
                    i = json.loads(raw)["index"]
                    seen[i] = seen.get(i, 0) + 1
            out[name] = seen
        return out

    def journal(self, name: str) -> list[dict[str, Any]]:
        path = self.run_dirs[name] / "ownership.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def wait(self, name: str, cond: Any, what: str, timeout: float = 120) -> dict[str, Any]:
        return wait_status(self.run_dirs[name], cond, timeout, f"{name}: {what}")


def launch(tmp_path: Path, sshd: SshServer, s3: S3Server, sims: Any, prompts: int,
           env: dict[str, dict[str, str]] | None = None) -> Nodes:
    """gen-1 fast and gen-2 slow (its simulator about a hundred times slower, two requests at
    a time), one campaign `traces`, launched; back once gen-1 is done and gen-2 has a rate."""
    speeds = {"gen-1": (FAST_SIM, 8), "gen-2": (SLOW_SIM, 2)}
    specs, run_dirs = {}, {}
    for name, (sim_args, conc) in speeds.items():
        folder = tmp_path / name
        folder.mkdir()
        write_prompts(folder / "prompts.jsonl", prompts)
        specs[name] = write_spec(folder / "run.toml", folder / "prompts.jsonl",
                                 [sims(*sim_args).url], s3=s3, batch_size=20,
                                 concurrency_per_server=conc)
        run_dirs[name] = folder / "run"
    nodes = Nodes(tmp_path, sshd, s3, specs, run_dirs, tmp_path / "fleet.toml", prompts)
    nodes.write_fleet(env)
    r = nodes.deck("launch", "traces", "--yes", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    nodes.wait("gen-1", lambda s: s["status"] == "done", "done")
    # A node with no rate in its engine's first seconds is warming up and gives nothing: the
    # slow node must have finished something for a plan to move its tail.
    nodes.wait("gen-2", lambda s: s["progress"]["completed"] >= 1, "a first completion")
    return nodes


def console_sees_idle(nodes: Nodes, name: str) -> None:
    """Wait until `fleetdeck status CAMPAIGN --json` shows `name` done with nothing left."""
    def check() -> bool:
        r = nodes.deck("status", "traces", "--json")
        for e in json.loads(r.stdout or "{}").get("nodes", []):
            snap = e.get("snapshot") or {}
            p = snap.get("progress") or {}
            if e["node"] == name and snap.get("status") == "done" and \
                    p.get("total") == p.get("completed", 0) + p.get("failed", 0):
                return True
        return False

    wait_until(check, 120, f"the console to see {name} done", interval=0.5)


def moved_lines(stdout: str) -> list[tuple[int, str, str, str]]:
    """`moved N indices A -> B (cede ID, ...)` lines: (N, A, B, ID)."""
    return [(int(m.group(1).replace(",", "")), m.group(2), m.group(3), m.group(4))
            for m in re.finditer(r"moved ([\d,]+) indices (\S+) -> (\S+) \(cede (\S+),",
                                 stdout)]


def owned_at_end(nodes: Nodes, name: str, shard: tuple[int, int]) -> set[int]:
    """What `name` owns after its journal: its shard, each cede taken out and each adopt put
    in, in the journal's order (a move may come back: a node given work can cede it on)."""
    k, n = shard
    owned = {i for i in range(nodes.prompts) if i % n == k}
    for ev in nodes.journal(name):
        moved = set(expand(ev["ranges"]))
        owned = owned - moved if ev["op"] == "cede" else owned | moved
    return owned


def check_union(nodes: Nodes) -> None:
    """Every index of the prompts file in exactly one line of one node's batches; each node's
    lines are exactly what it owns at the end by its own journal; each cede is adopted by the
    other node under its id, with the same ranges."""
    lines = nodes.batches()
    twice = {i for i in lines["gen-1"] if i in lines["gen-2"]}
    assert not twice, f"sent by both nodes: {sorted(twice)[:20]}"
    for name, seen in lines.items():
        again = {i: n for i, n in seen.items() if n > 1}
        assert not again, f"{name}: indices with more than one line: {again}"
    assert sorted([*lines["gen-1"], *lines["gen-2"]]) == list(range(nodes.prompts))
    shards = {"gen-1": (0, 2), "gen-2": (1, 2)}
    for ceder, adopter in (("gen-2", "gen-1"), ("gen-1", "gen-2")):
        cedes = {e["id"]: e for e in nodes.journal(ceder) if e["op"] == "cede"}
        adopts = {e["id"]: e for e in nodes.journal(adopter) if e["op"] == "adopt"}
        assert cedes.keys() == adopts.keys(), (ceder, adopter)
        k, n = shards[ceder]
        for cid, ev in cedes.items():
            assert set(expand(ev["ranges"])) == set(expand(adopts[cid]["ranges"])), cid
            assert adopts[cid]["node"] == ceder and adopts[cid]["shard"] == f"{k}/{n}", cid
    for name, shard in shards.items():
        owned = owned_at_end(nodes, name, shard)
        got = set(lines[name])
        assert got == owned, (f"{name}: lines for indices it does not own "
                              f"{sorted(got - owned)[:20]}, owned with no line "
                              f"{sorted(owned - got)[:20]}; journal {nodes.journal(name)}")


def stop(nodes: Nodes) -> None:
    for rd in nodes.run_dirs.values():
        if (rd / "supervisor.pid").exists():
            agent("down", str(rd), "--yes")
        kill_run(rd)


def test_rebalance_moves_the_slow_shards_tail_to_the_idle_node(
        tmp_path: Path, sshd: SshServer, s3: S3Server, sims: Any) -> None:
    nodes = launch(tmp_path, sshd, s3, sims, prompts=240)
    try:
        slow = rpc_status(nodes.run_dirs["gen-2"])["progress"]
        left = slow["total"] - slow["completed"] - slow["failed"]
        assert left > 60, slow  # gen-2 is still far from done
        r = nodes.deck("rebalance", "traces", "--yes", "--min", "20")
        assert r.returncode == 0, r.stdout + r.stderr
        ((count, frm, to, cid),) = moved_lines(r.stdout)
        assert (frm, to) == ("gen-2", "gen-1") and cid.startswith("rb-traces-")
        # The idle node is many times faster: it takes most of what gen-2 had left.
        assert left // 2 < count <= left, (count, left)
        # Journaled on both sides under the one id, each step in its node's audit trail.
        (cede,) = nodes.journal("gen-2")
        (adopt,) = nodes.journal("gen-1")
        assert cede["id"] == adopt["id"] == cid and cede["count"] == adopt["count"] == count
        for name, method in (("gen-2", "cede"), ("gen-1", "adopt")):
            trail = [json.loads(x) for x in
                     (nodes.run_dirs[name] / "control.log.jsonl").read_text().splitlines()]
            assert [(t["method"], t["params"]["id"]) for t in trail if t["method"] == method] \
                == [(method, cid)]
        # --auto keeps at it until both are done.
        r = nodes.deck("rebalance", "traces", "--yes", "--min", "4", "--auto",
                       "--interval", "0.5")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "every node is done" in r.stdout
        for name in nodes.run_dirs:
            snap = nodes.wait(name, lambda s: s["status"] == "done", "done")
            assert snap["progress"]["failed"] == 0
        check_union(nodes)
        r = nodes.deck("status", "traces", "--json")
        roll = json.loads(r.stdout)["campaign"]
        assert (roll["completed"], roll["total"], roll["unadopted"]) == (240, 240, [])
    finally:
        stop(nodes)


def unadopted(nodes: Nodes) -> list[dict[str, Any]]:
    r = nodes.deck("status", "traces", "--json")
    out: list[dict[str, Any]] = json.loads(r.stdout)["campaign"]["unadopted"]
    return out


def s3_text(s3: S3Server, key: str) -> str:
    try:
        body: bytes = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    except ClientError:  # not there yet
        return ""
    return body.decode()


async def tui_until_adopted(nodes: Nodes, cede_id: str) -> list[str]:
    """The TUI on the fleet file until gen-1 has journaled the adopt of `cede_id`; the
    notifications it showed."""
    rec = Recorder()
    app = FleetdeckApp(load_fleet(nodes.fleet))
    async with app.run_test(size=(160, 48), message_hook=rec) as pilot:
        await until(pilot, lambda: any(e["op"] == "adopt" and e["id"] == cede_id
                                       for e in nodes.journal("gen-1")), 120,
                    f"the TUI's adopt of {cede_id}")
        await until(pilot, lambda: rec.has("adopted cede"), 120, "its report")
    return rec.notes


def test_a_kill_at_either_step_loses_nothing_and_sends_nothing_twice(
        tmp_path: Path, sshd: SshServer, s3: S3Server, sims: Any) -> None:
    # gen-1's supervisor dies at its first adopt (journaled, nothing sent); gen-2's at its
    # second cede (journaled, not answered).
    crash = {"gen-1": {"FLEETDECK_CRASH_AT": "adopted"},
             "gen-2": {"FLEETDECK_CRASH_AT": "ceded:2"}}
    nodes = launch(tmp_path, sshd, s3, sims, prompts=400, env=crash)
    step = ("rebalance", "traces", "--yes", "--min", "20", "--max", "30")
    try:
        # 1. The idle node killed once its adopt is journaled.
        r = nodes.deck(*step)
        assert r.returncode == 3, r.stdout + r.stderr
        assert "gen-1: adopt rb-traces-" in r.stderr and "no answer" in r.stderr
        (adopt,) = nodes.journal("gen-1")
        # gen-1's journal holds it, whatever became of its supervisor: adopted, not again.
        r = nodes.deck("rebalance", "traces", "--yes", "--min", "20")
        assert "gen-1 owns 30 indices not done" in r.stderr and "resume gen-1" in r.stderr
        assert "adopted cede" not in r.stdout and moved_lines(r.stdout) == []
        assert nodes.journal("gen-1") == [adopt] and len(nodes.journal("gen-2")) == 1
        nodes.write_fleet({"gen-2": crash["gen-2"]})  # gen-1 comes back without its crash
        assert nodes.deck("resume", "gen-1").returncode == 0
        nodes.wait("gen-1", lambda s: s["status"] == "done" and s["progress"]["total"] ==
                   230, "the adopted 30 done")

        # 2. The slow node killed once its cede is journaled, before it answers. First the
        # console itself must see gen-1 idle (what the plan reads), not only its supervisor.
        console_sees_idle(nodes, "gen-1")
        r = nodes.deck(*step)
        assert r.returncode == 3, r.stdout + r.stderr
        assert "gen-2: cede rb-traces-" in r.stderr and "no answer" in r.stderr
        cede = nodes.journal("gen-2")[-1]
        assert [u["id"] for u in unadopted(nodes)] == [cede["id"]]
        nodes.write_fleet()
        assert nodes.deck("resume", "gen-2").returncode == 0
        r = nodes.deck("rebalance", "traces", "--yes", "--min", "20", "--max", "30")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"adopted cede {cede['id']}: 30 indices from gen-2 now on gen-1" in r.stdout
        assert moved_lines(r.stdout) == []  # the cede finished; nothing new this round
        nodes.wait("gen-1", lambda s: s["status"] == "done" and s["progress"]["total"] ==
                   260, "the second 30 done")

        # 3. The console killed between the cede's answer and the adopt.
        r = nodes.deck(*step, env={"FLEETDECK_CONSOLE_CRASH_AT": "between_cede_and_adopt"})
        assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
        cede = nodes.journal("gen-2")[-1]
        r = nodes.deck("status", "traces")
        assert f"gen-2 ceded 30 indices (cede {cede['id']}) that no node has adopted" \
            in r.stdout
        # verify judges the union from S3: once gen-2's journal is there, it names the cede.
        key = "runs/test/journals/s01of02/ownership.jsonl"
        wait_until(lambda: cede["id"] in s3_text(s3, key), 120, f"cede {cede['id']} in {key}")
        r = nodes.deck("verify", "traces")
        assert r.returncode != 0 and f"UNADOPTED {cede['id']} from shard 1/2 (gen-2): 30 " \
            "indices" in r.stdout, r.stdout + r.stderr
        # The TUI of a campaign with rebalance = "auto" finishes it on its refresh.
        nodes.write_fleet(rebalance="auto")
        notes = asyncio.run(tui_until_adopted(nodes, cede["id"]))
        assert any(f"traces: adopted cede {cede['id']}: 30 indices from gen-2 now on gen-1"
                   in n for n in notes), notes

        # The rest, then every index once.
        r = nodes.deck("rebalance", "traces", "--yes", "--min", "4", "--auto",
                       "--interval", "0.5")
        assert r.returncode == 0, r.stdout + r.stderr
        for name in nodes.run_dirs:
            nodes.wait(name, lambda s: s["status"] == "done", "done")
        check_union(nodes)
        assert len(nodes.journal("gen-2")) >= 3
    finally:
        stop(nodes)


@pytest.mark.parametrize(("args", "why"), [
    (["c"], "a dangerous action; add --yes"),
    (["--read-only", "c", "--yes"], "not allowed in read-only mode"),
    (["c", "--yes", "--min", "-1"], "--min must be >= 0 and --max >= 1"),
    (["c", "--yes", "--max", "0"], "--min must be >= 0 and --max >= 1"),
    (["t", "--yes"], "campaign t trains"),
    (["nope", "--yes"], "no campaign named 'nope'")])
def test_a_rebalance_that_may_not_run_exits_2_before_calling_a_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], why: str) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[nodes]]\nname = "a"\nlocal = true\nrun_dir = "/nowhere/a"\n'
                     '[[nodes]]\nname = "b"\nlocal = true\nrun_dir = "/nowhere/b"\n'
                     'role = "train"\n'
                     '[[campaigns]]\nname = "c"\nnodes = ["a"]\n'
                     '[[campaigns]]\nname = "t"\nnodes = ["b"]\n')
    ro = ["--read-only"] if args[0] == "--read-only" else []
    rest = args[1:] if ro else args
    assert cli_main(["--fleet", str(fleet), *ro, "rebalance", *rest]) == 2
    assert why in capsys.readouterr().err
