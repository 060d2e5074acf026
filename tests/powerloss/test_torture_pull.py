"""Power-loss torture of pull at a smoke size, through benchmarks/powerloss.py's own entry
point (so that the full-size script cannot silently break)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.powerloss.harness import ForgetfulDir
from tests.powerloss.torture import pull


def test_pull_power_cut_everywhere(forgetful_dir: ForgetfulDir, tmp_path: Path) -> None:
    fig = pull.torture(forgetful_dir, tmp_path, cuts=40, seed=2)
    print(fig.line())
    assert fig.by_kind["finished"] > 0 and fig.by_kind["renamed into place"] > 0
    assert fig.kept["files whole after the cut"] > 0 and fig.kept["fetched again"] > 0


def test_the_benchmark_script_at_a_smoke_size(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.powerloss import main

    main(["--cuts", "10", "--only", "pull", "--seed", "4", "--per-kind", "2"])
    out = capsys.readouterr().out
    assert "pull " in out and "10 cuts in all, 0 lost, 0 doubled, every total exact" in out
