"""A campaign's verified union on the console (issue 15, item 3), with real processes: agents
over the real sshd, SeaweedFS S3, simulators. `verify CAMPAIGN` (every node's verify, then the
union judged from S3), tampering named by index, `decommission-check` of a campaign node while
another still runs (and refused while a cede waits), and `reassign` of a node killed -9 mid-run
to the other node, which finishes its work: every index exactly once, and the dead node may
never resume."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents.artifacts.union import indices_text
from console.cli import main
from tests.agent.stdio import request, serve
from tests.console_headless.test_headless_ssh import AGENT, node_toml
from tests.engine.runs import write_prompts, write_spec
from tests.plugins.supervised import agent, kill_run, wait_status
from tests.servers.ports import wait_until
from tests.servers.s3 import S3Server
from tests.servers.sshd import SshServer

PREFIX = "runs/test/"  # write_spec's


@dataclass
class Nodes:
    fleet: Path
    run_dirs: dict[str, Path]
    s3: S3Server

    def fd(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(self.fleet),
                               *args], capture_output=True, text=True, timeout=timeout)

    def keys(self, tag: str = "") -> list[str]:
        client = self.s3.client()
        out = []
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=self.s3.bucket, Prefix=PREFIX, Delimiter="/"):
            out += [o["Key"] for o in page.get("Contents", []) if tag in o["Key"]]
        return sorted(out)

    def lines(self, key: str) -> list[bytes]:
        body = self.s3.client().get_object(Bucket=self.s3.bucket, Key=key)["Body"].read()
        return [x for x in body.split(b"\n") if x.strip()]

    def indices(self, key: str) -> list[int]:
        return [json.loads(x)["index"] for x in self.lines(key)]

    def down(self) -> None:
        for rd in self.run_dirs.values():
            if (rd / "supervisor.pid").exists():
                agent("down", str(rd), "--yes")
            kill_run(rd)


def campaign(tmp_path: Path, sshd: SshServer, s3: S3Server, urls: list[str],
             prompts: int) -> Nodes:
    """gen-1 and gen-2 over the sshd, each its own folder, the same prompts and one S3 prefix
    (the S3 keys in the agent's environment, as an operator's would be)."""
    agent_cmd = " ".join(["env", *(f"{k}={v}" for k, v in s3.env().items()), AGENT])
    text = f'[console]\npull_dir = "{tmp_path / "pulls"}"\n\n'
    run_dirs = {}
    for name, url in zip(("gen-1", "gen-2"), urls, strict=True):
        folder = tmp_path / name
        folder.mkdir()
        write_prompts(folder / "prompts.jsonl", prompts)
        spec = write_spec(folder / "run.toml", folder / "prompts.jsonl", [url], s3=s3,
                          batch_size=20)
        run_dirs[name] = folder / "run"
        text += node_toml(name, sshd, run_dirs[name], agent_cmd=agent_cmd) + \
            f'spec = "{spec}"\n'
    text += '[[campaigns]]\nname = "traces"\nnodes = ["gen-1", "gen-2"]\n'
    (tmp_path / "fleet.toml").write_text(text)
    return Nodes(tmp_path / "fleet.toml", run_dirs, s3)


def progress(run_dir: Path, cond: Any, timeout: float, what: str) -> None:
    """Wait for the engine's progress.json (written whole, each second) to satisfy `cond`."""
    def check() -> bool:
        try:
            return bool(cond(json.loads((run_dir / "progress.json").read_bytes())))
        except (FileNotFoundError, json.JSONDecodeError):
            return False

    wait_until(check, timeout, what, interval=0.1)


def done(p: dict[str, Any], completed: int | None = None) -> bool:
    return p["status"] == "done" and (completed is None or p["completed"] == completed)


def launch_until_gen1_done(nodes: Nodes) -> None:
    """`launch traces --yes`, then back once gen-1 (the fast node) is done."""
    r = nodes.fd("launch", "traces", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    progress(nodes.run_dirs["gen-1"], done, 120, "gen-1 done")


def test_a_dead_node_is_reassigned_and_the_union_holds_until_s3_is_tampered_with(
        tmp_path: Path, sshd: SshServer, sims: Any, s3: S3Server,
        capsys: pytest.CaptureFixture[str]) -> None:
    # gen-2's simulator is slow: it is mid-run when gen-1 is done.
    nodes = campaign(tmp_path, sshd, s3, [sims().url, sims("--time-scale", "1.0").url],
                     prompts=200)
    one, two = nodes.run_dirs["gen-1"], nodes.run_dirs["gen-2"]
    try:
        launch_until_gen1_done(nodes)
        progress(two, lambda p: p["s3_uploaded"] >= 1, 120, "a batch of gen-2's in S3")
        assert nodes.fd("pause", "gen-2").returncode == 0
        progress(two, lambda p: p["status"] == "paused" and p["in_flight"] == 0, 120,
                 "gen-2 paused")

        # gen-1 finished: it may go back while gen-2 still runs.
        assert nodes.fd("pull", "gen-1").returncode == 0
        r = nodes.fd("decommission-check", "gen-1", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        items = {i["name"]: i for i in json.loads(r.stdout)["items"]}
        assert items["journals in S3"]["ok"] and items["no unadopted cede"]["ok"], items

        # gen-2 cedes six indices that nobody adopts: its shard is not safe to leave.
        ceded = serve(two, request(1, "cede", id="rb-test", count=6), env=s3.env())
        cede = ceded.by_id(1)["result"]
        assert cede["count"] == 6, ceded
        progress(two, lambda p: p["ownership"]["cedes"] and not p["ownership"]["s3_behind"],
                 120, "gen-2's cede in S3")
        r = nodes.fd("decommission-check", "gen-2", "--json")
        assert r.returncode == 1
        items = {i["name"]: i for i in json.loads(r.stdout)["items"]}
        assert not items["no unadopted cede"]["ok"]
        (named,) = items["no unadopted cede"]["missing"]
        assert named.startswith("rb-test: 6 indices (")

        # reassign is refused while gen-2 answers and runs, and for names not in the campaign
        # (those before any node is asked: in this process).
        r = nodes.fd("reassign", "traces", "gen-2", "--to", "gen-1", "--yes")
        assert r.returncode == 1 and "gen-2 is reachable and its run is paused" in r.stderr
        for args, words in [(("gen-2", "--to", "gen-1"), "add --yes"),
                            (("gen-2", "--to", "gen-2", "--yes"), "the node being replaced"),
                            (("gen-3", "--to", "gen-1", "--yes"), "gen-3 is not a node of"),
                            (("gen-2", "--to", "gen-9", "--yes"), "--to gen-9 is not a node")]:
            assert main(["--fleet", str(nodes.fleet), "reassign", "traces", *args]) == 2
            assert words in capsys.readouterr().err, args
        assert nodes.keys("journals/reassign/") == []

        # gen-2 dies for good: its whole process tree, SIGKILL.
        kill_run(two)
        uploaded = {i for k in nodes.keys("_s01of02_") for i in nodes.indices(k)}
        r = nodes.fd("reassign", "traces", "gen-2", "--to", "gen-1", "--yes")
        assert r.returncode == 0, r.stdout + r.stderr
        moved = json.loads(r.stdout)
        rec = moved["record"]
        expected = set(range(1, 200, 2)) - uploaded
        expected -= {i for a, b, c in cede["ranges"] for i in range(a, b, c)}
        assert (rec["id"], rec["shard"], rec["node"], rec["to"]) == \
            ("reassign-s01of02", "1/2", "gen-2", "gen-1")
        assert rec["count"] == len(expected) and not moved["existed"]
        assert moved["key"] == f"s3://{s3.bucket}/{PREFIX}journals/reassign/reassign-s01of02.json"
        progress(one, lambda p: done(p, 100 + len(expected)) and p["total"] == p["completed"],
                 120, "gen-1 done with gen-2's indices")

        # The cede nobody adopted still shows; gen-2's own verify does not count any more.
        r = nodes.fd("verify", "traces", "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        out = json.loads(r.stdout)
        assert [(u["id"], u["count"], u["reassign"]) for u in out["union"]["unadopted"]] == \
            [("rb-test", 6, False)]
        assert [n["counted"] for n in out["nodes"]] == [True, False]
        assert "reassigned to gen-1 (record reassign-s01of02)" in out["nodes"][1]["reassigned"]
        adopted = serve(one, request(1, "adopt", id="rb-test", ranges=cede["ranges"],
                                     node="gen-2", shard="1/2"), env=s3.env())
        assert adopted.by_id(1)["result"]["count"] == 6, adopted
        progress(one, lambda p: done(p, 106 + len(expected)), 120, "gen-1 done with the six")

        r = nodes.fd("verify", "traces", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        union = json.loads(r.stdout)["union"]
        assert union["ok"] and union["unadopted"] == []
        assert [(s["shard"], s["node"], s["reassigned_to"]) for s in union["shards"]] == \
            [("0/2", "gen-1", None), ("1/2", "gen-2", "gen-1")]
        assert union["shards"][0]["done"] == 106 + len(expected) == union["shards"][0]["owned"]
        # Every index exactly once in S3, whoever did it.
        seen: dict[int, str] = {}
        for key in nodes.keys("completions_"):
            for i in nodes.indices(key):
                assert i not in seen, f"index {i} in {seen[i]} and {key}"
                seen[i] = key
        assert sorted(seen) == list(range(200))

        # A retry of the reassign finds the record and finishes (nothing moves twice).
        r = nodes.fd("reassign", "traces", "gen-2", "--to", "gen-1", "--yes")
        assert r.returncode == 0 and json.loads(r.stdout)["existed"], r.stderr

        # gen-2 comes back: it refuses to start, naming the record, and uploads nothing.
        before = nodes.keys("_s01of02_")
        assert nodes.fd("resume", "gen-2").returncode == 0
        snap = wait_status(two, lambda s: "reassigned" in (s.get("message") or ""), 120,
                           "gen-2 refused")
        assert "journals/reassign/reassign-s01of02.json" in snap["message"]
        r = nodes.fd("resume", "gen-2")
        assert r.returncode == 1 and "shard 1/2 was reassigned from gen-2 to gen-1" in r.stderr
        assert nodes.keys("_s01of02_") == before

        # Tampered with in S3: a line of gen-2's in one of gen-1's batches (that index done
        # twice), and another of gen-1's batches gone (its indices missing).
        ones, twos = nodes.keys("_s00of02_"), nodes.keys("_s01of02_")
        stray = nodes.lines(twos[0])[0]
        twice = json.loads(stray)["index"]
        client = s3.client()
        client.put_object(Bucket=s3.bucket, Key=ones[0],
                          Body=b"\n".join([*nodes.lines(ones[0]), stray]) + b"\n")
        gone = nodes.indices(ones[-1])
        client.delete_object(Bucket=s3.bucket, Key=ones[-1])
        r = nodes.fd("verify", "traces", "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        checks = {c["name"]: c for c in json.loads(r.stdout)["union"]["checks"]}
        assert [n for n, c in checks.items() if not c["ok"]] == \
            ["done_once", "done_by_owner", "complete"]
        assert checks["done_once"]["detail"] == (
            f"1 indices done twice, in the batches of shards 0/2 (gen-1) and 1/2 (gen-2): "
            f"{twice}")
        assert checks["complete"]["detail"] == (
            f"{len(gone)} indices of shard 0/2 (gen-1) neither done nor failed (missing): "
            f"{indices_text(gone)}")
        r = nodes.fd("verify", "traces")
        assert r.returncode == 1 and "campaign traces: verify FAILED" in r.stderr
        assert "gen-1 (0/2): verify FAIL" in r.stdout  # its own verify sees S3 changed too
        assert "(not counted: its shard 1/2 was reassigned to gen-1" in r.stdout
        assert "FAIL  done_once: 1 indices done twice" in r.stdout
    finally:
        nodes.down()


def test_verify_union_is_read_only_and_checks_its_params(tmp_path: Path) -> None:
    """A read-only session may ask for the union; bad params are named."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text('[run]\nname = "x"\n')
    got = serve(run_dir, request(1, "verify_union", shards=0), request(2, "verify_union"),
                request(3, "reassign", id="r", shard="1/2", node="a", to="a"),
                args=("--read-only",))
    assert "must be a whole number >= 1" in got.by_id(1)["error"]["message"]
    assert "no [s3] in run.toml" in got.by_id(2)["error"]["message"]
    assert "read-only session" in got.by_id(3)["error"]["message"]
    # One id per shard (what a cut-off node's uploader looks for), and two distinct nodes.
    got = serve(run_dir, request(1, "reassign", id="r", shard="1/2", node="a", to="b"),
                request(2, "reassign", id="reassign-s01of02", shard="1/2", node="a", to="a"))
    assert "the id of shard 1/2's reassign is 'reassign-s01of02', not 'r'" in \
        got.by_id(1)["error"]["message"]
    assert "node and to are both 'a'" in got.by_id(2)["error"]["message"]
