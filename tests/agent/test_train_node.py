"""A training node in the fleet: the supervisor runs prepare then train as its job, status
carries the trainer's progress, and pull takes the latest and best checkpoints only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from console.artifacts.decommission import pull_node
from console.fleet import Node
from console.transport import AgentLink
from tests.plugins.supervised import rpc_status, wait_status
from tests.servers.ports import wait_until
from tests.trainer.tinyworld import build_world, word_lines, write_batches, write_spec


def up(spec: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "agents.cli", "up", str(spec)],
                          capture_output=True, text=True, timeout=180, env=env)


async def test_supervised_training_run_and_its_pull(tmp_path: Path) -> None:
    world = build_world(tmp_path / "target", teach_steps=0)
    write_batches(tmp_path / "data", word_lines(120))
    run_dir = tmp_path / "run"
    spec = write_spec(tmp_path / "run.toml", str(tmp_path / "data"), world.target, run_dir,
                      max_steps=30, save_every=10, keep_last=5)
    r = up(spec)
    assert r.returncode == 0, r.stderr
    try:
        seen = wait_status(run_dir, lambda s: (s.get("train") or {}).get("step", 0) > 0, 180,
                           "training steps")
        assert seen["kind"] == "train" and seen["source"] == "supervisor"
        assert seen["train"]["total_steps"] == 30 and seen["servers"] == []
        done = wait_status(run_dir, lambda s: s["status"] == "done", 300, "training done")
        train = done["train"]
        assert train["step"] == 30 and train["last_checkpoint"] and train["best_checkpoint"]
        assert (run_dir / "prepared" / "prepare_report.json").exists()

        node = Node(name="train-1", run_dir=str(run_dir), role="train", local=True,
                    agent=f"{sys.executable} -m agents.cli")
        link = AgentLink(node)
        await link.connect()
        try:
            report = await pull_node(link, node, tmp_path / "pulls")
        finally:
            await link.close()
        assert report.ok, report.failed
        dest = tmp_path / "pulls" / "train-1" / "tiny"
        pulled = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
        assert "progress.json" in pulled and "logs/train.log" in pulled
        ckpt_dirs = {p.split("/")[1] for p in pulled if p.startswith("checkpoints/epoch_")}
        keep = {Path(train["last_checkpoint"]).name, Path(train["best_checkpoint"]).name}
        assert ckpt_dirs == keep, (ckpt_dirs, keep)
        on_node = {p.name for p in (run_dir / "checkpoints").glob("epoch_*")}
        assert len(on_node) > len(keep), "every checkpoint would have been pulled anyway"
    finally:
        subprocess.run([sys.executable, "-m", "agents.cli", "down", str(run_dir), "--yes"],
                       capture_output=True, timeout=180)
        wait_until(lambda: rpc_status(run_dir)["source"] == "disk", 120, "supervisor gone")
    assert json.loads((run_dir / "control.log.jsonl").read_text().splitlines()[0])[
        "method"] == "launch"
