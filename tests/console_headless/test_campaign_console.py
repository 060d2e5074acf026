"""Campaigns on the console (issue 15, items 1 and 2): `[[campaigns]]` in the fleet file,
`fleetdeck launch CAMPAIGN` (a check round on every node first: nothing starts unless every
node answers, the prompt files agree and the shards split the set exactly once), `status
CAMPAIGN` (one roll-up of the shards) and the campaign-wide control verbs, each sent to every
node as its own audited call."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.fleet import FleetError, load_fleet


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
