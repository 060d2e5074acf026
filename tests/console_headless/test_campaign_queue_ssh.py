"""A queue campaign driven with the `fleetdeck` CLI alone, end to end over the real OpenSSH
sshd on loopback: each node a "host" reached through sshd with its own run dir, spec and
simulated SGLang server; the campaign's queue on the real SeaweedFS S3 server. `launch
CAMPAIGN` starts every node, a node added to the fleet file joins the running campaign with
`launch CAMPAIGN --only NODE`, `status CAMPAIGN` shows the queue's figures, `verify CAMPAIGN`
(and `--deep`) proves the commits and names a damaged batch, and `retry CAMPAIGN truncated`
makes a retry generation the nodes run. A campaign with an unreachable node starts nowhere.

What the queue holds is read here with boto3 from the campaign's prefix (its commit
objects, the retry generation's record), not from the console's own summary."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.console_headless.test_headless_ssh import AGENT, fleetdeck, node_toml
from tests.engine.runs import write_prompts, write_spec
from tests.plugins.supervised import kill_run, wait_status
from tests.queue.prefix import PrefixReader, indices
from tests.servers.ports import free_ports, kill_pid, wait_until
from tests.servers.s3 import S3Server, running_s3
from tests.servers.sshd import SshServer, running_sshd
from tests.simserver import FAST_ARGS, SimHandle, start_sim

# Every wait is for a condition; this bounds it on a loaded 2-core machine.
RUN_S = 180.0
LINES = 360
CHUNK = 12  # 30 chunks in generation 0
# The engines' figures and journal often, S3 calls bounded (inherited through the agent by
# the supervisor and its engine).
ENGINE_ENV = {"FLEETDECK_S3_TIMEOUT_S": "5", "FLEETDECK_JOURNAL_INTERVAL_S": "1",
              "FLEETDECK_PROGRESS_INTERVAL_S": "0.2"}
# Answers with a median of 56 tokens: at max_tokens 64 a good share is cut ("length").
ANSWERS = ("--answer-median", "56")
# gen-1 and gen-2 answer at the simulator's own pace (about 0.3 s a request), gen-3 at once:
# the campaign lasts long enough for gen-3 to join it, and gen-3 makes it end soon after.
SLOW = ("--time-scale", "1.0", "--load-seconds", "0", "--decode-log-interval-s", "20")


# -- shared servers -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def host() -> Iterator[SshServer]:
    """One sshd for every "host": the nodes differ by run dir (a short path: sshd dislikes
    long ones)."""
    with running_sshd() as server:
        yield server


@pytest.fixture(scope="module")
def store() -> Iterator[S3Server]:
    """One SeaweedFS; each campaign under a prefix of its own."""
    with running_s3() as s3:
        yield s3


def sim_admin(h: SimHandle, path: str, body: dict[str, str] | None) -> None:
    """One of SGLang's admin calls to a simulator (pause_generation, continue_generation)."""
    r = httpx.post(f"{h.url}{path}", json=body, timeout=30.0)
    assert r.status_code == 200, (path, r.status_code, r.text)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimHandle]]:
    """Each node's own simulated SGLang server, started together."""
    root = tmp_path_factory.mktemp("sims")
    handles = {name: start_sim(root, *args, *ANSWERS, "--seed", str(k), name=name,
                               wait_ready=False)
               for k, (name, args) in enumerate([("gen-1", SLOW), ("gen-2", SLOW),
                                                 ("gen-3", FAST_ARGS)])}
    try:
        for name, h in handles.items():
            wait_until(functools.partial(_ready, h.url), RUN_S, f"{name}'s simulator", h.proc)
        yield handles
    finally:
        for h in handles.values():
            kill_pid(h.proc)


# -- the campaign ---------------------------------------------------------------------------------

@dataclass
class Campaign(PrefixReader):
    name: str
    fleet: Path
    entries: dict[str, str]  # each node's fleet-file table
    run_dirs: dict[str, Path]
    s3: S3Server
    prefix: str

    def write_fleet(self, members: list[str]) -> None:
        """The fleet file: every node's table, and the campaign of `members`."""
        listed = ", ".join(f'"{n}"' for n in members)
        self.fleet.write_text("".join(self.entries.values())
                              + f'[[campaigns]]\nname = "{self.name}"\nnodes = [{listed}]\n')

    def started(self) -> list[str]:
        """The nodes where anything was launched: a supervisor, or a run.toml kept."""
        return [n for n, rd in self.run_dirs.items()
                if (rd / "supervisor.pid").exists() or (rd / "run.toml").exists()]

    def stop(self) -> None:
        for rd in self.run_dirs.values():
            kill_run(rd)


def make_campaign(tmp_path: Path, name: str, ssh: SshServer, s3: S3Server,
                  urls: dict[str, str], down: tuple[str, ...] = ()) -> Campaign:
    """A node per `urls` entry, each with its own folder, prompts file (the same bytes) and
    spec: one `[s3]` prefix for all, a `[queue]` section (no node: launch names it). Nodes in
    `down` point at a closed port. The S3 keys reach the engine as an operator's would: in
    the agent's environment on the node."""
    prefix = f"campaigns/{tmp_path.name}/"
    env = {**s3.env(), **ENGINE_ENV}
    if os.environ.get("PYTHONPATH"):  # the code under test, on the "host" too
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    agent_cmd = " ".join(["env", *(f"{k}={v}" for k, v in env.items()), AGENT])
    closed = free_ports(1)[0]
    entries, run_dirs = {}, {}
    for node, url in urls.items():
        folder = tmp_path / node
        folder.mkdir()
        prompts = folder / "prompts.jsonl"
        write_prompts(prompts, LINES)
        spec = write_spec(folder / "run.toml", prompts, [url], s3=s3, max_tokens=64,
                          batch_size=10, concurrency_per_server=4, request_timeout_s=60.0)
        text = spec.read_text().replace('prefix = "runs/test/"', f'prefix = "{prefix}"')
        text = text.replace('name = "test-run"', f'name = "{node}"')
        spec.write_text(text + f"\n[queue]\nchunk_size = {CHUNK}\nlease_s = 6.0\npoll_s = 0.5\n")
        run_dirs[node] = folder / "run"
        entries[node] = node_toml(node, ssh, run_dirs[node], agent_cmd=agent_cmd,
                                  port=closed if node in down else None) \
            + f'spec = "{spec}"\n'
    return Campaign(name, tmp_path / "fleet.toml", entries, run_dirs, s3, prefix)


def holds_a_chunk(run_dir: Path) -> bool:
    try:
        p = json.loads((run_dir / "progress.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return bool((p.get("queue") or {}).get("held"))


def ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr


def answered_by(r: subprocess.CompletedProcess[str]) -> list[str]:
    """The nodes a fanned-out verb printed a result for, in order."""
    return [line.split(":")[0] for line in r.stdout.splitlines()]


def all_done(c: Campaign, nodes: list[str]) -> None:
    for n in nodes:
        wait_status(c.run_dirs[n], lambda s: s["status"] == "done", RUN_S, f"{n} done")


# -- the tests ------------------------------------------------------------------------------------

def test_a_campaign_with_an_unreachable_node_is_refused_and_starts_nowhere(
        tmp_path: Path, host: SshServer, store: S3Server) -> None:
    c = make_campaign(tmp_path, "cut", host, store, {"gen-a": "http://127.0.0.1:9",
                                                     "gen-b": "http://127.0.0.1:9"},
                      down=("gen-b",))
    c.write_fleet(["gen-a", "gen-b"])
    try:
        r = fleetdeck(c.fleet, "launch", "cut", "--yes")
        assert r.returncode == 3, r.stdout + r.stderr
        assert "gen-b: launch check:" in r.stderr and "connection refused" in r.stderr, r.stderr
        assert "nothing was started on any node" in r.stderr and r.stdout == "", r.stderr
        assert "gen-a: launch check" not in r.stderr  # gen-a passed its check, and got nothing
        assert c.started() == []
        # Nothing of the campaign in S3 either: no pin, no member, no lease (gen-a's check
        # round probed the store under the prefix and removed its probe).
        assert [k for k in c.listing() if "/probe/" not in k] == []
    finally:
        c.stop()


def test_a_queue_campaign_launched_joined_watched_verified_and_retried(
        tmp_path: Path, host: SshServer, store: S3Server,
        servers: dict[str, SimHandle]) -> None:
    c = make_campaign(tmp_path, "traces", host, store, {n: h.url for n, h in servers.items()})
    first, everyone = ["gen-1", "gen-2"], ["gen-1", "gen-2", "gen-3"]
    chunks = -(-LINES // CHUNK)
    c.write_fleet(first)  # gen-3 is in the fleet file, not yet in the campaign
    try:
        # 1. Launch on the two nodes: both start and take chunks from the one queue.
        r = fleetdeck(c.fleet, "launch", "traces", "--yes")
        ok(r)
        assert "campaign traces: check passed on 2 nodes" in r.stderr
        assert answered_by(r) == first and c.started() == first
        wait_until(lambda: all(holds_a_chunk(c.run_dirs[n]) for n in first), RUN_S,
                   "gen-1 and gen-2 each hold a chunk")
        # Their servers held still while the pause goes out, so no chunk ends (and none is
        # claimed) during it however long the call takes on a loaded machine: what is left
        # is certain to be left for the node that joins. (A freeze of seconds: deadlines are
        # at least 30 s.)
        for n in first:
            sim_admin(servers[n], "/pause_generation", {"mode": "in_place"})
        try:
            # Paused (every node of the campaign, each its own call), they hold what they
            # have and claim nothing more.
            r = fleetdeck(c.fleet, "pause", "traces")
            ok(r)
            assert answered_by(r) == first
            for n in first:
                wait_status(c.run_dirs[n], lambda s: s["status"] == "paused", RUN_S,
                            f"{n} paused")
        finally:
            for n in first:
                sim_admin(servers[n], "/continue_generation", None)
        taken = {int(k.rsplit("/", 1)[1]) for k in c.listing("leases/gen-0000/")}
        assert len(taken) < chunks, (taken, chunks)

        # gen-3 added to the campaign in the fleet file joins the running campaign alone.
        c.write_fleet(everyone)
        r = fleetdeck(c.fleet, "launch", "traces", "--only", "gen-3", "--yes")
        ok(r)
        assert "campaign traces: check passed on 1 nodes" in r.stderr
        assert answered_by(r) == ["gen-3"] and c.started() == everyone
        wait_until(lambda: any(x["node"] == "gen-3" for x in c.commits(0).values()), RUN_S,
                   "gen-3 commits a chunk")
        r = fleetdeck(c.fleet, "unpause", "traces")
        ok(r)
        assert answered_by(r) == everyone
        wait_until(lambda: len(c.commits(0)) == chunks, RUN_S, "every chunk committed")
        all_done(c, everyone)

        # 2. status CAMPAIGN: the queue's figures as S3's commit objects have them.
        gen0 = c.commits(0)
        pin = json.loads(c.read(f"{c.prefix}campaign.json"))
        assert (pin["campaign"], pin["prompts_lines"], pin["chunk_size"]) == \
            ("traces", LINES, CHUNK)
        assert sorted(gen0) == list(range(chunks))
        by_node = Counter(x["node"] for x in gen0.values())
        assert set(by_node) <= set(everyone) and by_node["gen-3"] >= 1, by_node
        r = fleetdeck(c.fleet, "status", "traces", "--json")
        ok(r)
        out = json.loads(r.stdout)
        roll, queue = out["campaign"], out["queue"]
        assert (roll["status"], roll["chunks"], roll["committed"], roll["total"]) == \
            ("done", chunks, len(gen0), LINES)
        assert roll["answered"] == 3 and roll["warnings"] == [], roll["warnings"]
        assert [(row["node"], row["link"], row["status"]) for row in roll["rows"]] == \
            [(n, "connected", "done") for n in everyone]
        assert {row["node"]: row["committed_here"] for row in roll["rows"]} == \
            {n: by_node[n] for n in everyone}
        assert all(row["held"] == [] for row in roll["rows"])
        (g0,) = queue["generations"]
        assert (g0["generation"], g0["chunks"], g0["committed"]) == (0, chunks, len(gen0))
        assert sorted(queue["nodes"]) == everyone
        assert all("member" in v and "given_back" not in v for v in queue["nodes"].values())
        r = fleetdeck(c.fleet, "status", "traces")
        ok(r)
        lines = r.stdout.splitlines()
        assert lines[0].startswith(f"campaign traces: generate done  {chunks}/{chunks} chunks "
                                   "committed (100.0%);"), r.stdout
        for n in everyone:
            (line,) = [x for x in lines if x.startswith(f"  {n} ")]
            assert line.startswith(f"  {n} connected done") and \
                f", {by_node[n]} chunks committed" in line, r.stdout

        # 3. verify: the proof from the commits, shallow (HEADs) and deep (every body read).
        batches = {p["key"] for x in gen0.values() for p in x["batches"]}
        r = fleetdeck(c.fleet, "verify", "traces")
        ok(r)
        assert f"ok: {chunks}/{chunks} chunks committed over 1 generation(s)" in r.stdout, \
            r.stdout
        assert f"{len(batches)} batches" in r.stdout
        r = fleetdeck(c.fleet, "verify", "traces", "--deep", "1", "--json")
        ok(r)
        report = json.loads(r.stdout)
        assert report["ok"] and report["problems"] == []
        assert (report["chunks"], report["committed"], report["heads"], report["deep_read"]) == \
            (chunks, chunks, len(batches), len(batches))
        failed = set().union(*(indices(x["failed"]) for x in gen0.values()))
        assert (report["done"], report["failed"]) == (LINES - len(failed), len(failed))

        # 4. retry truncated: generation 1 over exactly the indices the commits mark cut, at
        # the new max_tokens; the nodes (all finished) are resumed and run it.
        cut = set().union(*(indices(x["truncated"]) for x in gen0.values()))
        assert 0 < len(cut) < LINES - len(failed), "the simulator should cut some answers"
        r = fleetdeck(c.fleet, "retry", "traces", "truncated", "--max-tokens", "1024")
        ok(r)
        assert f"generation 1: {len(cut)} truncated indices in" in r.stderr, r.stderr
        assert "at max_tokens 1024" in r.stderr
        assert answered_by(r) == everyone  # each node resumed
        gen = json.loads(c.read(f"{c.prefix}gens/gen-0001.json"))
        assert (gen["generation"], gen["why"], gen["max_tokens"]) == (1, "truncated", 1024)
        assert set().union(*(indices(ch) for ch in gen["chunks"])) == cut
        assert sum(len(indices(ch)) for ch in gen["chunks"]) == len(cut)  # each index once
        wait_until(lambda: len(c.commits(1)) == len(gen["chunks"]), RUN_S,
                   "every chunk of generation 1 committed")
        all_done(c, everyone)
        gen1 = c.commits(1)
        assert all(x["attempt"] == 2 for x in gen1.values())
        redone = set().union(*(indices(x["done"]) | indices(x["failed"])
                               for x in gen1.values()))
        assert redone == cut
        # A retry batch's lines: the second attempt, at the new max_tokens.
        part = next(p for x in gen1.values() for p in x["batches"])
        redo = [json.loads(raw) for raw in c.read(part["key"]).splitlines()]
        redo = [x for x in redo if x["index"] in indices(part["indices"]) and x["attempt"] == 2]
        assert len(redo) == len(indices(part["indices"]))
        assert all(x["max_tokens"] == 1024 for x in redo), redo[0]
        r = fleetdeck(c.fleet, "verify", "traces")
        ok(r)
        total = chunks + len(gen["chunks"])
        assert f"ok: {total}/{total} chunks committed over 2 generation(s)" in r.stdout, r.stdout

        # 3, continued: one batch object overwritten in S3 (same size, other bytes): verify
        # fails, naming it.
        key = sorted(batches)[0]
        body = c.read(key)
        damaged = body[:-2] + bytes([body[-2] ^ 0x01]) + body[-1:]
        store.client().put_object(Bucket=store.bucket, Key=key, Body=damaged,
                                  ChecksumAlgorithm="SHA256")
        r = fleetdeck(c.fleet, "verify", "traces")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "FAILED" in r.stdout
        (problem,) = [x for x in r.stdout.splitlines() if x.startswith("  - ")]
        assert f"s3://{store.bucket}/{key}" in problem and "sha256" in problem, r.stdout
    finally:
        c.stop()
