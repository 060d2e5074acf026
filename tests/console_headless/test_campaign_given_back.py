"""A campaign node given back early (issue 15, item 3: "finished nodes can go back early"), with
real processes: two agents over the real sshd, SeaweedFS S3, simulators. Once gen-1 passes
`decommission-check` and its machine is gone (its SSH port closed), the campaign goes on
without it: `status` counts its shard with the figures it had, `rebalance --auto` sends it no
work and ends when gen-2 is done, `verify` judges it by the union in S3. And the pure parts:
when a kept pass holds, and what the plan does with a node that is leaving."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.schema import Snapshot
from console.campaign import Member
from console.campaign_rebalance import Readopt, all_done, move_id, plan
from console.fleet import Campaign, Fleet, Node
from console.given_back import (
    LINK,
    holds,
    read_record,
    record_path,
    with_given_back,
    write_record,
)
from tests.console import data as d
from tests.console_headless.test_campaign_rebalance import member
from tests.console_headless.test_campaign_union import (
    campaign,
    done,
    launch_until_gen1_done,
    progress,
)
from tests.servers.ports import free_ports
from tests.servers.s3 import S3Server
from tests.servers.sshd import SshServer


def snapshot(run: str = "traces", status: str = "done", total: int = 100,
             completed: int = 100, shard: str = "0/2") -> dict[str, Any]:
    p = d.progress(run=run, shard=shard, campaign="traces", status=status, total=total,
                   completed=completed, failed=0, rate_per_sec=0.0)
    return d.generate_snapshot(run=run, status=status, progress=p, alerts=[
        {"code": "idle", "severity": "warning", "message": "GPUs idle — pull and decommission",
         "since": d.NOW, "actions": ["pull", "decommission"]}])


def busy_snap() -> Snapshot:
    return msgspec.convert(snapshot(total=130, completed=100, status="running"), Snapshot)


def fleet_of(tmp_path: Path) -> tuple[Fleet, Campaign]:
    names = ["gen-0", "gen-1"]
    c = Campaign("traces", names)
    fleet = Fleet(nodes=[Node(name=x, run_dir=f"/r/{x}", local=True) for x in names],
                  campaigns=[c], source="fleet.toml")
    fleet.console.pull_dir = str(tmp_path / "pulls")
    return fleet, c


def test_a_kept_pass_holds_until_the_node_has_more_to_do(tmp_path: Path) -> None:
    fleet, _ = fleet_of(tmp_path)
    path = write_record(fleet.pull_dir, "gen-1", snapshot())
    assert path == record_path(fleet.pull_dir, "gen-1") and path.exists()
    rec = read_record(fleet.pull_dir, "gen-1")
    assert rec is not None and rec.run == "traces" and rec.snapshot.progress is not None
    assert holds(rec, None)  # gone: the pass is all that is known
    live = msgspec.convert(snapshot(), Snapshot)
    assert holds(rec, live)
    assert not holds(rec, busy_snap())
    assert not holds(rec, msgspec.convert(snapshot(total=130), Snapshot))  # adopted more
    assert not holds(rec, msgspec.convert(snapshot(status="paused"), Snapshot))
    assert not holds(rec, msgspec.convert(snapshot(run="other"), Snapshot))
    # Down: given back, its figures then (not the last it sent), without its alerts then.
    # Answering with the run that passed: leaving.
    for m in with_given_back(fleet, [Member("gen-1", "unreachable", None, "refused"),
                                     Member("gen-1", "reconnecting", busy_snap())]):
        assert (m.link, m.leaving) == (LINK, True) and m.snapshot is not None
        assert m.snapshot.status == "done" and m.snapshot.alerts == []
        assert "passed decommission-check at" in (m.error or "")
    (m,) = with_given_back(fleet, [Member("gen-1", "connected", live)])
    assert (m.link, m.leaving) == ("connected", True)
    # A node that answers is never given back (an RPC error, an unreadable snapshot): its
    # own word stands; having passed, it is leaving.
    for odd in (Member("gen-1", "error", None, "refused"),
                Member("gen-1", "connected", None, "unreadable snapshot")):
        (m,) = with_given_back(fleet, [odd])
        assert (m.link, m.snapshot, m.error, m.leaving) == (odd.link, None, odd.error, True)
    # Working again (resumed, launched anew, adopted more): the pass is void and removed, so a
    # later outage is an outage.
    assert with_given_back(fleet, [Member("gen-1", "connected", busy_snap())])[0].leaving is \
        False
    assert read_record(fleet.pull_dir, "gen-1") is None
    (m,) = with_given_back(fleet, [Member("gen-1", "unreachable", None, "refused")])
    assert (m.link, m.snapshot) == ("unreachable", None)
    path = write_record(fleet.pull_dir, "gen-1", snapshot())
    # A record that does not parse, or names another node, proves nothing.
    record_path(fleet.pull_dir, "gen-0").parent.mkdir(parents=True)
    record_path(fleet.pull_dir, "gen-0").write_text('{"node": "gen-0"')
    assert read_record(fleet.pull_dir, "gen-0") is None
    record_path(fleet.pull_dir, "gen-0").write_bytes(path.read_bytes())
    assert read_record(fleet.pull_dir, "gen-0") is None


def test_a_leaving_node_takes_no_work_and_a_cede_meant_for_it_waits(tmp_path: Path) -> None:
    fleet, c = fleet_of(tmp_path)
    slow = member("gen-0", "0/2", total=1000, completed=100, rate=1.0)
    idle = member("gen-1", "1/2", status="done", total=500, completed=500, rate=5.0)
    assert [m.idle for m in plan(fleet, c, [slow, idle], 1, 10).moves] == ["gen-1"]
    leaving = replace(idle, leaving=True)
    assert plan(fleet, c, [slow, leaving], 1, 10).empty
    # A cede of a move meant for it: it never adopted it (its status says so) and takes no
    # work, so another node finishes the move (here the only other one: the ceder).
    rb = move_id(c, "gen-0", "gen-1", 5)
    ceded = member("gen-0", "0/2", total=1000, completed=100, rate=1.0, cedes=((rb, 40),))
    p = plan(fleet, c, [ceded, leaving], 1, 10)
    assert p.readopts == [Readopt(rb, "gen-0", 40, "gen-0")] and p.moves == []
    # A cede nobody can adopt keeps --auto going: not every node is done while it waits.
    c3 = Campaign("traces", ["gen-0", "gen-1", "gen-2"])
    fleet3 = Fleet(nodes=[Node(name=f"gen-{i}", run_dir=f"/r/{i}", local=True)
                          for i in range(3)], campaigns=[c3], source="fleet.toml")
    rb3 = move_id(c3, "gen-0", "gen-2", 5)
    finished = member("gen-0", "0/3", status="done", total=1000, completed=960,
                      cedes=((rb3, 40),))
    quiet = [finished, member("gen-1", "1/3", status="done", total=1000, completed=1000),
             Member("gen-2", "unreachable", None, "refused")]
    p = plan(fleet3, c3, quiet, 1, 10)
    assert p.waiting == 1 and not all_done(p)


def test_a_node_given_back_early_leaves_the_campaign_whole(
        tmp_path: Path, sshd: SshServer, sims: Any, s3: S3Server) -> None:
    nodes = campaign(tmp_path, sshd, s3, [sims().url, sims("--time-scale", "0.3").url],
                     prompts=120)
    one, two = nodes.run_dirs["gen-1"], nodes.run_dirs["gen-2"]
    try:
        launch_until_gen1_done(nodes)
        progress(two, lambda p: p["status"] == "running" and p["completed"] < 60, 120,
                 "gen-2 still running")
        assert nodes.fd("pull", "gen-1").returncode == 0
        r = nodes.fd("decommission-check", "gen-1")
        assert r.returncode == 0 and "SAFE to give the node back" in r.stdout, r.stdout
        rec = read_record(tmp_path / "pulls", "gen-1")
        assert rec is not None and rec.snapshot.progress is not None
        assert rec.snapshot.progress.completed == 60 and rec.checked_at <= time.time()

        # The machine goes back: gen-1's SSH port is closed from now on.
        text = nodes.fleet.read_text()
        nodes.fleet.write_text(text.replace(f"port = {sshd.port}",
                                            f"port = {free_ports(1)[0]}", 1))
        r = nodes.fd("status", "traces", "--json")
        assert r.returncode == 0, r.stdout + r.stderr  # given back is not unreachable
        roll = json.loads(r.stdout)["campaign"]
        gen1 = roll["shards"][0]
        assert (gen1["node"], gen1["link"], gen1["status"], gen1["completed"]) == \
            ("gen-1", LINK, "done", 60)
        assert roll["answered"] == 2 and roll["total"] == 120 and roll["alerts"] == []
        r = nodes.fd("status", "traces")
        assert "gen-1 [0/2] given back done  60/60 done" in r.stdout, r.stdout
        assert "passed decommission-check at" in r.stdout

        # rebalance --auto gives it nothing and ends when gen-2 is done.
        r = nodes.fd("rebalance", "traces", "--yes", "--auto", "--min", "1", "--interval",
                     "0.5", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "moved" not in r.stdout and "every node is done" in r.stdout
        assert not (one / "ownership.jsonl").exists() and not (two / "ownership.jsonl").exists()
        progress(two, lambda p: done(p, 60), 120, "gen-2 done")

        # verify: the union from S3 (judged on gen-2) holds gen-1's shard.
        r = nodes.fd("verify", "traces", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout)
        assert out["unreachable"] == [] and out["union"]["ok"] and out["union_node"] == "gen-2"
        first = out["nodes"][0]
        assert not first["counted"] and "given back after a passing decommission-check" in \
            first["given_back"]
        assert [s["done"] for s in out["union"]["shards"]] == [60, 60]
    finally:
        nodes.down()
