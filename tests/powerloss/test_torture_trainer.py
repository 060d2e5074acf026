"""Power-loss torture of the trainer's checkpoints at a smoke size: a tiny training run with a
checkpoint every step, cut where each checkpoint is renamed into place, where it is proven
(its folder fsynced), where an old one is pruned, and at random moments. (The live cut, a real
trainer SIGKILLed mid-checkpoint, then the power, then --resume, runs in
benchmarks/powerloss.py: a trainer process of its own costs a torch import.)"""

from __future__ import annotations

from pathlib import Path

from tests.powerloss.harness import ForgetfulDir
from tests.powerloss.torture import trainer


def test_trainer_power_cut_everywhere(forgetful_dir: ForgetfulDir, tmp_path: Path) -> None:
    fig = trainer.torture(forgetful_dir, tmp_path, cuts=30, seed=6, per_kind=4,
                          live_cut=False)
    print(fig.line())
    assert {"checkpoint renamed into place", "checkpoint saved", "pruned"} <= set(fig.by_kind)
    assert fig.kept["resumed at step (sum)"] > 0
