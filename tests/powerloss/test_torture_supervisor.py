"""Power-loss torture of the supervisor with its servers at a smoke size: one supervised run
(`up` with a secret, resizes, a server killed and relaunched, everything SIGKILLed and the
power cut live, `resume` to the end), cut at its crash points, at each servers.json save and
at random moments; what a resume reads, and the engine's recovery, on each crash state."""

from __future__ import annotations

from pathlib import Path

from tests.powerloss.harness import ForgetfulDir
from tests.powerloss.torture import supervisor


def test_supervisor_power_cut_everywhere(forgetful_dir: ForgetfulDir, tmp_path: Path) -> None:
    fig = supervisor.torture(forgetful_dir, tmp_path, cuts=30, seed=5, per_kind=2)
    print(fig.line(), *fig.notes, sep="\n")
    assert {"servers.json saved", "lines_fsynced", "batch_close", "random"} <= set(fig.by_kind)
    assert fig.kept["control revs kept"] > 0 and fig.kept["lines kept"] > 0
