"""Campaigns on the console (issue 15, items 1 and 2): `[[campaigns]]` in the fleet file,
`fleetdeck launch CAMPAIGN` (a check round on every node first: nothing starts unless every
node answers, the prompt files agree and the shards split the set exactly once), `status
CAMPAIGN` (one roll-up of the shards) and the campaign-wide control verbs, each sent to every
node as its own audited call."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.rundir.schema import Alert, RunPin, Snapshot
from console.campaign import Member, human, roll_up
from console.campaign_launch import check_problems, launch_params, spec_problem
from console.fleet import Campaign, Fleet, FleetError, Node, load_fleet
from tests.console import data as d
from tests.console_headless.test_headless_ssh import AGENT, fleetdeck, node_toml
from tests.engine.runs import write_prompts, write_spec
from tests.plugins.supervised import agent, kill_run, wait_status
from tests.servers.ports import free_ports
from tests.servers.s3 import S3Server
from tests.servers.sshd import SshServer


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
    # What launch would carry to each node, and a launch that has no spec to start.
    assert launch_params(fleet, c, fleet.node("gen-2"), None) == \
        {"campaign": "traces", "spec": "/own.toml", "shard": "2/3"}
    assert launch_params(fleet, t, fleet.node("t-1"), "/x.toml") == \
        {"campaign": "drafter", "spec": "/x.toml", "node_rank": 1, "nnodes": 2}
    assert spec_problem(fleet, c) is None and spec_problem(fleet, t, "/x.toml") is None
    assert spec_problem(fleet, t) == ("campaign drafter: t-2, t-1 have no spec to launch: set "
                                      "spec in its [[campaigns]] table (one path, on every "
                                      "node) or in the node's own table")
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


# -- launch, status and the verbs on a campaign, over the real sshd -------------------------------

@dataclass
class CampaignNodes:
    fleet: Path
    run_dirs: dict[str, Path]
    specs: dict[str, Path]
    prompts: dict[str, Path]

    def started(self) -> list[str]:
        """The nodes where anything was launched: a supervisor, or a run.toml copied in."""
        return [n for n, rd in self.run_dirs.items()
                if (rd / "supervisor.pid").exists() or (rd / "run.toml").exists()]


@dataclass
class NoS3:
    """An [s3] section for a campaign that never starts (a shard needs one; nothing is sent)."""

    bucket: str = "never-used"
    endpoint_url: str = "http://127.0.0.1:9"

    def env(self) -> dict[str, str]:
        return {}


def make_campaign(tmp_path: Path, sshd: SshServer, urls: list[str], s3: Any = None,
                  prompts: int = 200, down: tuple[str, ...] = ()) -> CampaignNodes:
    """gen-1 and gen-2, each with its own folder, prompts file (the same bytes) and spec; one
    campaign `traces` of both, writing to one S3 prefix. Nodes in `down` point at a closed
    port. The S3 keys reach the engine the way an operator's would: in the agent's
    environment on the node."""
    closed = free_ports(1)[0]
    s3 = s3 or NoS3()
    agent_cmd = " ".join(["env", *(f"{k}={v}" for k, v in s3.env().items()), AGENT])
    text, run_dirs, specs, files = "", {}, {}, {}
    for i, name in enumerate(("gen-1", "gen-2")):
        folder = tmp_path / name
        folder.mkdir()
        files[name] = folder / "prompts.jsonl"
        write_prompts(files[name], prompts)
        specs[name] = write_spec(folder / "run.toml", files[name], [urls[i]], s3=s3,
                                 batch_size=20)
        run_dirs[name] = folder / "run"
        text += node_toml(name, sshd, run_dirs[name], port=closed if name in down else None,
                          agent_cmd=agent_cmd)
        text += f'spec = "{specs[name]}"\n'
    text += campaign("traces", ["gen-1", "gen-2"])
    return CampaignNodes(fleet_file(tmp_path, text), run_dirs, specs, files)


def pin_shard(spec: Path, shard: str) -> None:
    """The node's own spec already pins a shard (the fleet file's is then not the one run)."""
    spec.write_text(spec.read_text().replace("[generate]\n", f'[generate]\nshard = "{shard}"\n'))


def refused(nodes: CampaignNodes, *names: str) -> None:
    """`launch CAMPAIGN --yes` exits 2 naming each of `names`, and nothing starts anywhere."""
    r = fleetdeck(nodes.fleet, "launch", "traces", "--yes")
    assert r.returncode == 2, r.stdout + r.stderr
    for name in (*names, "nothing was started"):
        assert name in r.stderr, f"{name!r} not in:\n{r.stderr}"
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert nodes.started() == [], "a refused campaign started something"


def test_a_campaign_that_would_not_split_cleanly_starts_nowhere(tmp_path: Path,
                                                                 sshd: SshServer) -> None:
    nodes = make_campaign(tmp_path, sshd, ["http://127.0.0.1:9", "http://127.0.0.1:9"])
    try:
        r = fleetdeck(nodes.fleet, "launch", "traces")  # dangerous: --yes, as any launch
        assert r.returncode == 2 and "add --yes" in r.stderr
        r = fleetdeck(nodes.fleet, "--read-only", "launch", "traces", "--yes")
        assert r.returncode == 2 and "read-only" in r.stderr

        # Prompt files that differ by one line: their sha256 differ.
        with open(nodes.prompts["gen-2"], "a") as f:
            f.write('{"messages": [{"role": "user", "content": "one more"}]}\n')
        refused(nodes, "prompt files differ", "gen-1: ", "gen-2: ", "200 lines", "201 lines")
        write_prompts(nodes.prompts["gen-2"], 200)

        # Two nodes both 0/2: gen-2's own spec pins the shard the fleet file gives gen-1.
        gen2 = nodes.specs["gen-2"]
        plain = gen2.read_text()
        pin_shard(gen2, "0/2")
        refused(nodes, "gen-2", "0/2", "1/2")
        # A 9/8 there: no such shard.
        gen2.write_text(plain)
        pin_shard(gen2, "9/8")
        refused(nodes, "gen-2", "9/8")
        gen2.write_text(plain)

        # gen-2's run dir was an earlier campaign's shard 0/2: a run dir holds one shard.
        run_dir = nodes.run_dirs["gen-2"]
        run_dir.mkdir()
        pin = RunPin(prompts_path=str(nodes.prompts["gen-2"]), prompts_sha256="0" * 64,
                     prompts_lines=200, prompts_size=1, prompts_mtime_ns=1, model="m",
                     sampling={}, chat_template_kwargs={}, created_at=d.T0, shard="0/2")
        (run_dir / "run.pin.json").write_bytes(msgspec.json.encode(pin))
        refused(nodes, "gen-2", "pinned to shard 0/2")
    finally:
        for rd in nodes.run_dirs.values():
            kill_run(rd)


def answer(shard: str, sha: str = "a" * 64, lines: int = 200, run_dir: str = "") -> dict[str, Any]:
    return {"shard": shard, "prompts_sha256": sha, "prompts_lines": lines, "run_dir": run_dir}


def test_the_check_round_names_every_problem_in_the_answers() -> None:
    """What the nodes said in the check round, judged (console/campaign_launch.py): the same
    prompts, shards that split the set exactly once, a run directory each."""
    fleet = three_nodes()
    c = fleet.campaign("traces")
    ok = {"gen-1": answer("0/3", run_dir="/r/1"), "gen-2": answer("1/3", run_dir="/r/2"),
          "gen-3": answer("2/3", run_dir="/r/3")}
    assert check_problems(fleet, c, ok) == []
    both = {**ok, "gen-3": answer("1/3", run_dir="/r/3")}
    assert check_problems(fleet, c, both) == [
        "shards overlap: gen-2 and gen-3 are both 1/3 (their indices would be sent twice)"]
    (bad,) = check_problems(fleet, c, {**ok, "gen-3": answer("9/8", run_dir="/r/3")})
    assert "gen-3's check answer: shard 9/8" in bad
    (bad,) = check_problems(fleet, c, {**ok, "gen-1": answer("0/4", run_dir="/r/1")})
    assert "do not agree on N" in bad
    (bad,) = check_problems(fleet, c, {**ok, "gen-2": answer("1/3", "b" * 64, 201, "/r/2")})
    assert "prompt files differ" in bad and "gen-2: " + "b" * 64 + " (201 lines)" in bad
    (bad,) = check_problems(fleet, c, {**ok, "gen-3": answer("2/3", run_dir="/r/1")})
    assert bad == "gen-1 and gen-3 would share the run directory /r/1 on local"
    swapped = {**ok, "gen-1": answer("1/3", run_dir="/r/1"),
               "gen-2": answer("0/3", run_dir="/r/2")}
    (bad,) = check_problems(fleet, c, swapped)
    assert "gen-1 would run 1/3, not 0/3" in bad
    (bad,) = check_problems(fleet, c, {**ok, "gen-2": {**ok["gen-2"], "kind": "train"}})
    assert bad == "gen-2's spec is a train run, but campaign traces is of generate nodes"


def test_an_unreachable_node_stops_the_launch_on_every_node(tmp_path: Path,
                                                            sshd: SshServer) -> None:
    nodes = make_campaign(tmp_path, sshd, ["http://127.0.0.1:9"] * 2, down=("gen-2",))
    try:
        r = fleetdeck(nodes.fleet, "launch", "traces", "--yes")
        assert r.returncode == 3, r.stdout + r.stderr
        assert "gen-2: launch check:" in r.stderr and "nothing was started" in r.stderr
        assert nodes.started() == []  # gen-1 answered, and still got nothing
        # A control verb on the campaign: each node's answer named; a refusal (gen-1 has no
        # run yet) is exit 1, over an unreachable node's 3.
        r = fleetdeck(nodes.fleet, "pause", "traces")
        assert r.returncode == 1 and "gen-1: pause: " in r.stderr and "not a run directory" \
            in r.stderr and "gen-2: pause: gen-2: connection refused" in r.stderr, r.stderr
        # A dangerous verb on a campaign needs --yes like on one node.
        r = fleetdeck(nodes.fleet, "stop", "traces")
        assert r.returncode == 2 and "every node of campaign traces" in r.stderr
    finally:
        for rd in nodes.run_dirs.values():
            kill_run(rd)


def test_a_two_node_campaign_launches_and_rolls_up(tmp_path: Path, sshd: SshServer,
                                                   sims: Any, s3: S3Server) -> None:
    urls = [sims().url, sims().url]
    nodes = make_campaign(tmp_path, sshd, urls, s3)
    try:
        r = fleetdeck(nodes.fleet, "launch", "traces", "--yes", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "check passed on 2 nodes" in r.stderr
        assert [line.split(":")[0] for line in r.stdout.splitlines()] == ["gen-1", "gen-2"]
        for rd in nodes.run_dirs.values():
            wait_status(rd, lambda s: s["status"] == "done", 120, f"{rd} done")

        r = fleetdeck(nodes.fleet, "status", "traces", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        roll, entries = out["campaign"], out["nodes"]
        own = {e["node"]: e["snapshot"]["progress"] for e in entries}
        assert [e["node"] for e in entries] == ["gen-1", "gen-2"]
        # Each node ran its own shard: 100 of the 200 indices, i % 2 == K.
        assert own["gen-1"]["shard"] == "0/2" and own["gen-2"]["shard"] == "1/2"
        assert own["gen-1"]["campaign"] == "traces" == own["gen-2"]["campaign"]
        assert [own[n]["total"] for n in ("gen-1", "gen-2")] == [100, 100]
        for k, name in enumerate(("gen-1", "gen-2")):
            done = {int(line.split()[0]) for line in (nodes.run_dirs[name] / "completions"
                    / ".done_indices").read_text().split("\n") if line}
            assert done == set(range(k, 200, 2)), name
        # The roll-up is the nodes' own figures added up.
        for key in ("completed", "total", "failed", "truncated"):
            assert roll[key] == sum(p[key] for p in own.values()), key
        assert (roll["completed"], roll["total"], roll["status"]) == (200, 200, "done")
        assert roll["statuses"] == {"done": 2} and roll["answered"] == 2
        assert [(s["node"], s["shard"], s["completed"]) for s in roll["shards"]] == \
            [("gen-1", "0/2", own["gen-1"]["completed"]), ("gen-2", "1/2",
                                                            own["gen-2"]["completed"])]
        assert roll["warnings"] == [] and roll["unadopted"] == []
        # The whole fleet's status: the campaign's line first, then each node's.
        r = fleetdeck(nodes.fleet, "status")
        lines = r.stdout.splitlines()
        assert r.returncode == 0 and lines[0].startswith(
            "campaign traces: generate done  200/200 done (100.0%), 0 failed"), r.stdout
        assert lines[1].startswith("gen-1: generate test-run done  100/100 done"), r.stdout

        # A control verb on the campaign: each node's own call, each in its own audit trail.
        r = fleetdeck(nodes.fleet, "max-tokens", "traces", "512")
        assert r.returncode == 0, r.stderr
        assert [line.split(":")[0] for line in r.stdout.splitlines()] == ["gen-1", "gen-2"]
        for rd in nodes.run_dirs.values():
            trail = [json.loads(x) for x in (rd / "control.log.jsonl").read_text().splitlines()]
            assert [(t["method"], t["params"].get("value")) for t in trail][-1] == \
                ("max_tokens", 512)
        r = fleetdeck(nodes.fleet, "logs", "traces")  # one node's verb
        assert r.returncode == 2 and "traces is a campaign" in r.stderr
    finally:
        for rd in nodes.run_dirs.values():
            if (rd / "supervisor.pid").exists():
                agent("down", str(rd), "--yes")
            kill_run(rd)


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
    assert [(s.node, s.shard, s.status) for s in r.shards] == \
        [("t-1", "0/2", "running"), ("t-2", "1/2", "failed")]
    assert "step 6400/20000 loss 1.8342" in human(r)[0]
