"""Training across nodes: two supervised runs, each with its own run dir, launched by the
`launch` RPC as rank 0 and rank 1 of 2, train one drafter under torchrun's c10d rendezvous
(gloo on loopback); one node's trainer is killed -9 and the other stops with the reason
within 60 s; `resume` on both goes on from rank 0's last checkpoint."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agents.rundir.schema import TrainProgress, train_progress_decoder
from agents.rundir.spec import SpecError, load_spec
from tests.agent.stdio import request, serve
from tests.plugins.supervised import agent, kill_run, rpc_status
from tests.servers.ports import free_ports, wait_until
from tests.trainer.conftest import cli
from tests.trainer.tinyworld import World, word_lines, write_batches, write_spec
from trainer.distributed import NodeFacts, NodesError, lead_of

ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
# Small enough for two nodes on two cores; epochs enough that the run is never done here.
TRAIN: dict[str, Any] = {"batch_size": 4, "anchors": 16, "drafter_layers": 1,
                         "heldout_share": 0.1, "eval_samples": 4, "save_every": 3,
                         "keep_last": 5, "epochs": 500, "node_timeout_s": 10.0}


def progress(run_dir: Path) -> TrainProgress | None:
    try:
        return train_progress_decoder.decode((run_dir / "progress.json").read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def wait_progress(run_dir: Path, cond: Any, timeout: float, what: str) -> TrainProgress:
    seen: list[TrainProgress] = []

    def check() -> bool:
        p = progress(run_dir)
        if p is not None and cond(p):
            seen.append(p)
            return True
        return False

    wait_until(check, timeout, f"{run_dir.name}: {what}", interval=0.1)
    return seen[0]


def descendants(pid: int) -> list[int]:
    """pid and every process under it (torchrun starts its workers in sessions of their own,
    so a process group would miss them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def trainer_processes(run_dir: Path) -> list[int]:
    """The node's torchrun and workers: every process whose command line names its run.toml."""
    needle = str(run_dir / "run.toml").encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def step_of(checkpoint: str | None) -> int:
    m = re.search(r"step_(\d+)$", checkpoint or "")
    assert m, checkpoint
    return int(m.group(1))


@pytest.fixture
def nodes(tmp_path: Path, random_world: World, capsys: pytest.CaptureFixture[str]
          ) -> Any:
    """Two node specs (one data set, prepared once into a folder both read) and their runs,
    taken down (and killed if need be) at the end."""
    write_batches(tmp_path / "data", word_lines(60))
    (port,) = free_ports(1)
    prepared = tmp_path / "prepared"
    specs = [write_spec(tmp_path / f"node{k}.toml", str(tmp_path / "data"), random_world.target,
                        tmp_path / f"node{k}", prepared=str(prepared),
                        rdzv_endpoint=f"127.0.0.1:{port}", **TRAIN) for k in range(2)]
    r = cli(capsys, "prepare", str(specs[0]))
    assert r.returncode == 0, r.stderr
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)  # the agents, supervisors and trainers started from here inherit it
    try:
        yield specs, [tmp_path / "node0", tmp_path / "node1"]
    finally:
        for k in range(2):
            run_dir = tmp_path / f"node{k}"
            agent("down", str(run_dir), "--yes", timeout=180)
            kill_run(run_dir)
            for pid in trainer_processes(run_dir):  # torchrun or a worker left behind
                os.kill(pid, signal.SIGKILL)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_two_nodes_lose_one_and_resume(nodes: Any) -> None:
    specs, runs = nodes
    lead, follower = runs
    began = time.monotonic()
    # The console's launch of a training campaign: every node with its rank, together.
    with ThreadPoolExecutor(2) as pool:
        launched = list(pool.map(lambda k: serve(runs[k], request(
            1, "launch", spec=str(specs[k]), node_rank=k, nnodes=2), env=ENV), (0, 1)))
    for served in launched:
        assert "error" not in served.by_id(1), served.by_id(1)
    assert "node_rank = 1" in (follower / "run.toml").read_text()

    # Both train: rank 0 writes a checkpoint, rank 1 counts the same steps and says whose.
    first = wait_progress(lead, lambda p: p.status == "running" and p.last_checkpoint, 180,
                          "a checkpoint")
    assert first.nodes == 2 and first.node_rank == 0 and first.world_size == 2
    saved = step_of(first.last_checkpoint)
    behind = wait_progress(follower, lambda p: p.step >= saved, 120, f"step {saved}")
    assert behind.message == "rank 1 of 2, following rank 0" and behind.node_rank == 1
    assert behind.last_checkpoint is None and behind.loss is None
    assert not (follower / "checkpoints").exists(), "only rank 0 writes checkpoints"
    print(f"launched, trained to step {saved} and checkpointed in "
          f"{time.monotonic() - began:.1f} s")

    # kill -9 node 1's trainer (torchrun and its worker): node 0 stops with the reason.
    assert behind.pid is not None
    killed_at = time.monotonic()
    for pid in descendants(_parent(behind.pid)):
        os.kill(pid, signal.SIGKILL)
    stopped = wait_progress(lead, lambda p: p.status == "failed", 120, "the lost node seen")
    detected_s = time.monotonic() - killed_at
    print(f"node 1 killed -9: node 0 stopped in {detected_s:.1f} s: {stopped.message}")
    assert stopped.message is not None
    assert stopped.message.startswith("rank 1 of 2 (") and " lost: " in stopped.message, \
        stopped.message
    assert str(follower) in stopped.message and "resume" in stopped.message
    # Node 0's job exits too, non-zero; the console sees both nodes' health.
    wait_until(lambda: not trainer_processes(lead), 120, "node 0's trainer gone")
    assert "exitcode: 3" in (lead / "logs" / "train.log").read_text()
    snap0 = rpc_status(lead)
    assert snap0["status"] == "failed" and snap0["message"] == stopped.message
    snap1 = rpc_status(follower)
    assert snap1["status"] == "failed" and "exited with" in (snap1["message"] or "")
    last = stopped.last_checkpoint
    assert step_of(last) >= saved

    # resume on both: from rank 0's last checkpoint, not from 0.
    resume_both(runs, last)
    # A stop on one node stops both at one step, with rank 0's checkpoint there.
    r = agent("stop", str(follower), "--yes", timeout=180)
    assert r.returncode == 0, r.stderr
    end0 = wait_progress(lead, lambda p: p.status == "stopped", 120, "stopped")
    end1 = wait_progress(follower, lambda p: p.status == "stopped", 120, "stopped")
    assert end0.step == end1.step > step_of(last)
    assert step_of(end0.last_checkpoint) == end0.step
    assert end1.message is not None and end1.message.startswith("rank 1 of 2, following rank 0")
    assert not (follower / "checkpoints").exists()
    # Both torchruns end on their own (through their exit barrier), ready for a resume.
    wait_until(lambda: not trainer_processes(lead) and not trainer_processes(follower), 120,
               "both trainers gone")

    # Node 0 falls silent (stopped, not dead: no socket closes): node 1 stops within its
    # node_timeout_s, naming rank 0, whose rendezvous store no longer answers either.
    resume_both(runs, end0.last_checkpoint)
    frozen = trainer_processes(lead)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    silent_at = time.monotonic()
    try:
        # Stopped by the node watch: its " lost: " verdict names rank 0 and why. How long
        # after node_timeout_s that comes is the machine's load, not something to check.
        gone = wait_progress(follower, lambda p: p.status == "failed", 180, "silent node seen")
        detected_s = time.monotonic() - silent_at
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
    print(f"node 0 silent: node 1 stopped in {detected_s:.1f} s: {gone.message}")
    assert gone.message is not None and gone.message.startswith("rank 0 of 2 (")
    assert " lost: " in gone.message and str(lead) in gone.message


def resume_both(runs: list[Path], checkpoint: str | None) -> None:
    """`resume` on every node; rank 0 goes on from `checkpoint`, and steps past it."""
    began = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        resumed = list(pool.map(lambda d: agent("resume", str(d), timeout=180), runs))
    for r in resumed:
        assert r.returncode == 0, r.stderr
    step = step_of(checkpoint)
    wait_progress(runs[0], lambda p: p.status == "running" and p.step > step, 180,
                  f"steps after {step}")
    wait_progress(runs[1], lambda p: p.status == "running" and p.step > step, 120,
                  f"steps after {step}")
    assert f"resumed from {checkpoint} at step {step}" in (
        runs[0] / "logs" / "train.log").read_text()
    print(f"resumed from step {step} in {time.monotonic() - began:.1f} s")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2:].split()[1])


@pytest.mark.parametrize(("keys", "complaint"), [
    ({"nodes": 2}, "[train] rdzv_endpoint: required with nodes = 2"),
    ({"nodes": 2, "node_rank": 2, "rdzv_endpoint": "node-a:29400"}, "[train] node_rank"),
    ({"nodes": 2, "rdzv_endpoint": "node-a"}, "'node-a' is not HOST:PORT"),
    ({"nodes": 2, "rdzv_endpoint": "node-a:70000"}, "is not HOST:PORT"),
    ({"nodes": 0}, "[train] nodes: must be at least 1"),
    ({"node_timeout_s": 60.0, "join_timeout_s": 30.0}, "[train] join_timeout_s"),
])
def test_node_keys_are_checked_at_load(tmp_path: Path, keys: dict[str, Any],
                                       complaint: str) -> None:
    spec = write_spec(tmp_path / "run.toml", str(tmp_path), tmp_path, tmp_path / "run", **keys)
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert complaint in str(caught.value) and str(spec) in str(caught.value)


def test_launch_refuses_bad_node_params_and_starts_nothing(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "train.toml", str(tmp_path), tmp_path, tmp_path / "run",
                      rdzv_endpoint="127.0.0.1:29400")
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    gen = tmp_path / "gen.toml"
    gen.write_text(f'[run]\nname = "g"\ndir = "{tmp_path / "run"}"\n[servers]\n'
                   'urls = ["http://127.0.0.1:9"]\n[generate]\nprompts = "p.jsonl"\n')
    served = serve(tmp_path / "run",
                   request(1, "launch", spec=str(spec), node_rank=1),
                   request(2, "launch", spec=str(spec), node_rank=2, nnodes=2),
                   request(3, "launch", spec=str(spec), node_rank=-1, nnodes=2),
                   request(4, "launch", spec=str(gen), node_rank=0, nnodes=2))
    for rid, words in ((1, "node_rank and nnodes go together"), (2, "[train] node_rank"),
                       (3, "node_rank must be a whole number >= 0"),
                       (4, "are for training runs")):
        error = served.by_id(rid).get("error")
        assert error is not None and words in error["message"], (rid, served.by_id(rid))
    assert not (tmp_path / "run" / "run.toml").exists()
    assert not (tmp_path / "run" / "supervisor.pid").exists()


def test_node_ranks_must_be_each_nodes_own() -> None:
    def facts(*ranks: int) -> tuple[NodeFacts, ...]:
        return tuple(NodeFacts(r, 0, f"host{i}", f"/runs/{i}") for i, r in enumerate(ranks))

    assert lead_of(facts(1, 0), 2) == 1  # c10d's order is its own: node rank 0 leads
    with pytest.raises(NodesError, match=r"node_rank 1 is claimed by 2 nodes \(host0: /runs/0"):
        lead_of(facts(1, 1), 2)
    with pytest.raises(NodesError, match="node_rank 0: no node has it"):
        lead_of(facts(1, 2, 2)[:2], 3)
