"""scripts/gpu_train_check.sh, the one-GPU check at Qwen3-8B's shape, cannot silently break:
it parses, and its Python part runs the same path on the CPU at a tiny size (--toy)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_train_check.sh"


def test_the_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_the_toy_run_prints_every_figure() -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(SCRIPT), "--toy", "--steps", "2", "--warmup", "1"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "target 8 layers (lean: 6)" in out and "attention sdpa" in out
    rate = re.search(r"throughput +([\d,]+) tokens/s", out)
    assert rate and int(rate.group(1).replace(",", "")) > 0, out
    assert re.search(r"MFU +[\d.]+ TFLOP/s of 989 \(dense bf16 peak: H200 SXM datasheet\)",
                     out), out
    assert "peak memory   n/a on the CPU; plan" in out and "memory plan per rank" in out
    assert re.search(r"last loss \d+\.\d+", out), out
