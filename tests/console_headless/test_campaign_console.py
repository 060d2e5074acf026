"""Campaigns on the console (issue 15, items 1 and 2): `[[campaigns]]` in the fleet file,
`fleetdeck launch CAMPAIGN` (a check round on every node first: nothing starts unless every
node answers, the prompt files agree and the shards split the set exactly once), `status
CAMPAIGN` (one roll-up of the shards) and the campaign-wide control verbs, each sent to every
node as its own audited call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.rundir.schema import Alert, Snapshot
from console.campaign import Member, human, roll_up
from console.fleet import Campaign, Fleet, FleetError, Node, load_fleet
from tests.console import data as d


def node(name: str, role: str = "generate", spec: str | None = None) -> str:
    lines = ["[[nodes]]", f'name = "{name}"', "local = true", f'run_dir = "/r/{name}"',
             f'role = "{role}"']
    if spec:
        lines.append(f'spec = "{spec}"')
    return "\n".join(lines) + "\n"


def campaign(name: str, nodes: list[str], extra: str = "") -> str:
    listed = ", ".join(f'"{n}"' for n in nodes)
    return f'[[campaigns]]\nname = "{name}"\nnodes = [{listed}]\n{extra}\n'


def fleet_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


# -- the fleet file -----------------------------------------------------------------------------

def test_a_campaign_gives_each_node_its_shard_and_spec(tmp_path: Path) -> None:
    text = (node("gen-1") + node("gen-2", spec="/own.toml") + node("gen-3") + node("t-1", "train")
            + node("t-2", "train")
            + campaign("traces", ["gen-3", "gen-1", "gen-2"], 'spec = "/tpl.toml"\n'
                       'rebalance = "auto"')
            + campaign("drafter", ["t-2", "t-1"]))
    fleet = load_fleet(fleet_file(tmp_path, text))
    c = fleet.campaign("traces")
    assert [c.shard(n) for n in c.nodes] == ["0/3", "1/3", "2/3"]  # the order in `nodes`
    assert c.rebalance == "auto" and fleet.campaign_role(c) == "generate"
    assert c.spec_for(fleet.node("gen-1")) == "/tpl.toml"
    assert c.spec_for(fleet.node("gen-2")) == "/own.toml"  # the node's own spec wins
    t = fleet.campaign("drafter")
    assert fleet.campaign_role(t) == "train" and t.position("t-1") == 1
    assert t.rebalance == "off" and t.spec_for(fleet.node("t-1")) is None
    assert fleet.campaign_of("gen-1") is c and fleet.campaign_of("nope") is None
    with pytest.raises(FleetError, match=r"no campaign named 'other'.*traces, drafter"):
        fleet.campaign("other")


BAD_CAMPAIGNS = [
    pytest.param(campaign("c", ["gen-1", "gen-9"]), ["'gen-9'", "no node named", "key nodes"],
                 id="unknown-node"),
    pytest.param(campaign("c", ["gen-1", "gen-2", "gen-1"]), ["'gen-1'", "named twice"],
                 id="node-twice"),
    pytest.param(campaign("c", ["gen-1"]) + campaign("d", ["gen-2", "gen-1"]),
                 ["campaign 'd' (campaigns[1])", "'gen-1'", "already in campaign 'c'"],
                 id="node-in-two-campaigns"),
    pytest.param(campaign("c", []), ["key nodes is empty"], id="empty-nodes"),
    pytest.param(campaign("gen-2", ["gen-1"]), ["campaign 'gen-2'", "also a node's"],
                 id="name-of-a-node"),
    pytest.param(campaign("c", ["gen-1", "t-1"]), ["mixes generation and training",
                                                   "train: t-1"], id="mixed-roles"),
    pytest.param(campaign("c", ["gen-1"]) + campaign("c", ["gen-2"]), ["used twice"],
                 id="name-twice"),
    pytest.param(campaign("a/b", ["gen-1"]), ["name holds '/'"], id="name-a-path"),
    pytest.param(campaign("c", ["gen-1"], 'rebalance = "sometimes"'),
                 ["campaigns[0] key rebalance", "sometimes"], id="rebalance-unknown"),
    pytest.param(campaign("c", ["gen-1"], "shards = 3"), ["campaigns[0]", "shards"],
                 id="unknown-key"),
]


@pytest.mark.parametrize(("extra", "names"), BAD_CAMPAIGNS)
def test_a_bad_campaign_is_refused_naming_file_campaign_and_key(tmp_path: Path, extra: str,
                                                                names: list[str]) -> None:
    path = fleet_file(tmp_path, node("gen-1") + node("gen-2") + node("t-1", "train") + extra)
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    message = str(err.value)
    for name in [str(path), *names]:
        assert name in message, f"{name!r} not in: {message}"
    assert "campaigns[" in message, message  # which table, counted as in the file


# -- the roll-up (console/campaign.py: the one computation headless and the TUI draw from) -----

def three_nodes() -> Fleet:
    nodes = [Node(name=n, run_dir=f"/r/{n}", local=True) for n in ("gen-1", "gen-2", "gen-3")]
    return Fleet(nodes=nodes, campaigns=[Campaign("traces", ["gen-1", "gen-2", "gen-3"])],
                 source="fleet.toml")


def shard_snapshot(shard: str, **progress: Any) -> Snapshot:
    p = d.progress(run="traces", shard=shard, campaign="traces", **progress)
    raw = d.generate_snapshot(run="traces", status=p["status"], progress=p, alerts=[])
    return msgspec.convert(raw, Snapshot)


def test_the_roll_up_adds_the_shards_and_takes_the_slowest_eta() -> None:
    fleet = three_nodes()
    c = fleet.campaign("traces")
    alert = {"code": "server_down:2", "severity": "critical", "message": "server 2 is down",
             "since": d.NOW}
    one = shard_snapshot("0/3", completed=1000, total=3000, failed=10, truncated=40,
                         rate_per_sec=2.0, eta_hours=0.28, eta_p10_hours=0.25,
                         eta_p90_hours=0.31)
    two = shard_snapshot("1/3", completed=2500, total=3000, failed=5, truncated=60,
                         rate_per_sec=3.0, eta_hours=0.05, eta_p10_hours=None,
                         eta_p90_hours=None)
    two.alerts.append(msgspec.convert(alert, Alert))
    done = shard_snapshot("2/3", completed=2990, total=3000, failed=10, truncated=1,
                          rate_per_sec=0.0, eta_hours=0.0, status="done")
    members = [Member("gen-1", "connected", one), Member("gen-2", "connected", two),
               Member("gen-3", "connected", done)]
    r = roll_up(fleet, c, members)
    assert (r.completed, r.total, r.failed, r.truncated) == (6490, 9000, 25, 101)
    assert r.rate_per_sec == 5.0  # the live shards only; a done one sends nothing
    assert (r.eta_hours, r.slowest) == (0.28, "gen-1")
    # The band: each end the largest of the live shards' (gen-2 has none: its ETA counts).
    assert (r.eta_p10_hours, r.eta_p90_hours) == (0.25, 0.31)
    assert r.status == "running" and r.statuses == {"running": 2, "done": 1}
    assert [(a.node, a.alert.code) for a in r.alerts] == [("gen-2", "server_down:2")]
    assert r.critical == 1 and r.complete and not r.warnings and not r.unadopted
    assert [(s.node, s.shard, s.completed) for s in r.shards] == \
        [("gen-1", "0/3", 1000), ("gen-2", "1/3", 2500), ("gen-3", "2/3", 2990)]
    text = "\n".join(human(r))
    assert "6,490/9,000 done" in text and "ETA 0.28 h (p10-p90 0.25-0.31 h) (gen-1)" in text
    assert "ALERT gen-2 critical: server 2 is down" in text
    # A live shard whose ETA is not known yet: the campaign's is not known either.
    unknown = shard_snapshot("1/3", completed=0, total=3000, rate_per_sec=0.0, eta_hours=None)
    r = roll_up(fleet, c, [members[0], Member("gen-2", "connected", unknown), members[2]])
    assert r.eta_hours is None and r.slowest == "gen-2"


def test_a_cede_nobody_adopted_is_a_warning_until_one_adopts_it() -> None:
    fleet = three_nodes()
    c = fleet.campaign("traces")
    cede = {"cedes": [{"id": "rb-1", "count": 700, "time": d.NOW}], "adopts": []}
    slow = shard_snapshot("0/3", completed=100, total=2300, ownership=cede)
    idle = shard_snapshot("1/3", completed=3000, total=3000, status="done", eta_hours=0.0)
    other = shard_snapshot("2/3", completed=10, total=3000)
    r = roll_up(fleet, c, [Member("gen-1", "connected", slow), Member("gen-2", "connected", idle),
                           Member("gen-3", "unreachable", None, "connection refused")])
    assert [(u.node, u.id, u.count) for u in r.unadopted] == [("gen-1", "rb-1", 700)]
    (warning,) = r.warnings
    assert "gen-1 ceded 700 indices (cede rb-1)" in warning and "gen-3 did not answer" in warning
    assert r.answered == 2 and not r.complete
    assert "[2 of 3 nodes answered: totals are partial]" in human(r)[0]
    adopt = {"cedes": [], "adopts": [{"id": "rb-1", "count": 700, "time": d.NOW,
                                      "node": "gen-1", "shard": "0/3"}]}
    took = shard_snapshot("1/3", completed=3000, total=3700, ownership=adopt)
    r = roll_up(fleet, c, [Member("gen-1", "connected", slow), Member("gen-2", "connected", took),
                           Member("gen-3", "connected", other)])
    assert r.unadopted == [] and r.warnings == [] and r.total == 9000


def test_a_node_on_another_shard_or_campaign_is_named() -> None:
    fleet = three_nodes()
    c = fleet.campaign("traces")
    wrong = shard_snapshot("2/3")
    stray = msgspec.convert(d.generate_snapshot(progress=d.progress(shard="1/3",
                                                                    campaign="other")),
                            Snapshot)
    r = roll_up(fleet, c, [Member("gen-1", "connected", wrong),
                           Member("gen-2", "connected", stray)])
    assert r.warnings == ["gen-1 runs shard 2/3; the fleet file gives it 0/3",
                          "gen-2 runs for campaign 'other', not 'traces'"]
    assert r.answered == 2 and r.shards[2].link == "unknown"
