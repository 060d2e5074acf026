"""A finished run directory with S3 uploads, padded to a few hundred files and MBs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.servers.s3 import S3Server


@pytest.fixture
def finished_run(tmp_path: Path, sims, s3: S3Server) -> Path:
    sim = sims()
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 300)
    spec = write_spec(tmp_path / "run.toml", prompts, [sim.url], s3=s3, batch_size=25)
    engine = start_engine(spec, env=s3.env())
    assert engine.wait(300) == 0, engine.stderr()
    run_dir = engine.run_dir
    logs = run_dir / "logs"
    for i in range(300):
        (logs / f"shard_{i:03d}.log").write_text(f"log line of shard {i}\n" * (i + 1))
    with open(logs / "big.log", "wb") as f:
        for _ in range(24):
            f.write(os.urandom(8 * 2**20))  # 192 MiB
    (run_dir / "launch").mkdir(exist_ok=True)
    (run_dir / "launch" / "launch_gpu0.sh").write_text("#!/bin/sh\nexec sglang\n")
    return run_dir
