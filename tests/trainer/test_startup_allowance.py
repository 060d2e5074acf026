"""Timeouts that fit compilation. Across nodes: a first step that holds one node longer than
`node_timeout_s` (a first compile) passes under the start-up allowance; past
`startup_steps` the same hold stops the run within node_timeout_s, saying so. The Allowance
itself, between two real processes: one node always waits; across nodes a step with a shape
new to some rank (a recompile) waits, one of seen shapes does not."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.rundir.schema import train_progress_decoder
from tests.servers.ports import free_ports
from tests.trainer.conftest import REPO, cli
from tests.trainer.test_train_multinode import descendants
from tests.trainer.tinyworld import World, word_lines, write_batches, write_spec
from trainer.launch import torchrun_command

# Steady timeout far above a loaded 2-core box's scheduling gaps between two processes; the
# hold twice over it, so that without the allowance step 1 would stop the run.
NODE_TIMEOUT_S = 20.0
HOLD_S = 2 * NODE_TIMEOUT_S + 5
ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_across_nodes_a_slow_first_step_passes_and_a_slow_steady_step_stops_the_run(
        tmp_path: Path, random_world: World, capsys: pytest.CaptureFixture[str]) -> None:
    write_batches(tmp_path / "data", word_lines(60))
    (port,) = free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    specs = [write_spec(tmp_path / f"node{k}.toml", str(tmp_path / "data"),
                        random_world.target, tmp_path / f"node{k}",
                        prepared=str(tmp_path / "prepared"), batch_size=2, anchors=16,
                        drafter_layers=1, heldout_share=0.1, eval_samples=4, max_steps=8,
                        save_every=100, startup_steps=2, node_timeout_s=NODE_TIMEOUT_S,
                        join_timeout_s=300.0, shard="never", nodes=2, node_rank=k,
                        rdzv_endpoint=endpoint) for k in range(2)]
    assert cli(capsys, "prepare", str(specs[0])).returncode == 0
    env = {**os.environ, **ENV}
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"node{k}.log" for k in range(2)]
    try:
        for k in range(2):
            # Each node as `fleetdeck-train train` runs it (trainer/launch.py), with node 1's
            # process held in step 1 (start-up: waited for) and step 4 (steady: not).
            cmd = torchrun_command(["train", str(specs[k])], 1, 2, k, endpoint, "allowance",
                                   300.0, NODE_TIMEOUT_S)
            at = cmd.index("trainer.cli")
            cmd[at:at + 1] = ["tests.trainer.slow_rank", "1,4", str(HOLD_S)]
            with logs[k].open("wb") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                              env=env, cwd=REPO))
        began = time.monotonic()
        lead_rc = procs[0].wait(timeout=480)
        print(f"node 0 ended ({lead_rc}) after {time.monotonic() - began:.0f} s")
    finally:
        for p in procs:  # node 1 may still sleep in its hold: nothing more to see there
            if p.poll() is None:
                for pid in descendants(p.pid):
                    os.kill(pid, signal.SIGKILL)
            p.wait(timeout=60)
    lead, follower = (log.read_text(errors="replace") for log in logs)
    assert re.search(r"node 1\): step 1 held", follower), follower[-3000:]
    assert re.search(r"node 1\): step 4 held", follower), follower[-3000:]
    assert lead_rc != 0, lead[-3000:]
    assert f"start-up over after 2 steps: collectives wait at most {NODE_TIMEOUT_S:g} s" in lead
    p = train_progress_decoder.decode((tmp_path / "node0" / "progress.json").read_bytes())
    # Step 1 was taken (its hold outlasted node_timeout_s twice over): without the allowance
    # the run stops at 0. Step 4's hold stopped it with the collective's timeout: at 3, or
    # at 2 where the box stalled one process in step 3 over node_timeout_s.
    assert p.status == "failed" and 2 <= p.step <= 3, (p.status, p.step, p.message)
    assert p.message is not None and "timed out" in p.message.lower(), p.message
    assert f"node_timeout_s = {NODE_TIMEOUT_S:g} s after the first 2 steps" in p.message, \
        p.message


def test_one_node_always_waits_and_nodes_wait_for_a_new_shape() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tests.trainer.allowance_ranks"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    print(r.stdout)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: one node, steady False, generous False: waited" in r.stdout
        assert f"rank {rank}: nodes, a new shape on rank 1: generous True" in r.stdout
    assert "rank 0: nodes, seen shapes: generous False, gave up after" in r.stdout, r.stdout
