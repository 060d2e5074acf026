"""Power-loss torture at full size: the engine, the supervisor with its servers, pull and the
trainer's checkpoints, each recorded once on the forgetting filesystem (tests/powerloss/) and
cut at --cuts points in all (every crash point of agents/rundir/crashpoint.py that the
recordings pass, and the moments each component calls a write done, then random moments),
recovery alone run on each crash state. Each recording also cuts its power once live (real
processes SIGKILLed, then a real resume). Prints per component: cuts by kind, what recovery
kept, the time to record and to recover; any loss, double or miscount stops it with the cut.

    .venv/bin/python benchmarks/powerloss.py [--cuts 1000] [--only engine,pull] [--seed 1]
        [--per-kind N]   (at most N cuts of each crash point; all of them by default)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.powerloss.harness import ForgetfulDir, mount  # noqa: E402
from tests.powerloss.torture import engine, pull, supervisor, trainer  # noqa: E402
from tests.powerloss.torture.cuts import Figures  # noqa: E402

Torture = Callable[[ForgetfulDir, Path, int, int, int | None], Figures]
COMPONENTS: dict[str, tuple[Torture, float]] = {  # and its share of the cuts
    "engine": (engine.torture, 0.4),
    "supervisor": (supervisor.torture, 0.25),
    "pull": (pull.torture, 0.15),
    "trainer": (trainer.torture, 0.2),
}


def run(cuts: int, only: list[str], seed: int, per_kind: int | None) -> list[Figures]:
    shares = {name: COMPONENTS[name][1] for name in only}
    total = sum(shares.values())
    out = []
    for name in only:
        n = max(1, round(cuts * shares[name] / total))
        root = Path(tempfile.mkdtemp(prefix=f"fd-powerloss-{name}-"))
        fs = mount(root / "forgetful")
        try:
            out.append(COMPONENTS[name][0](fs, root, n, seed, per_kind))
        finally:
            fs.unmount()
            shutil.rmtree(root, ignore_errors=True)
    return out


def report(figures: list[Figures], wall_s: float) -> str:
    lines = [f.line() for f in figures]
    for f in figures:
        lines += [f"  {f.component}: {note}" for note in f.notes]
    cuts = sum(f.cuts for f in figures)
    lines.append(f"{cuts:,} cuts in all, 0 lost, 0 doubled, every total exact; "
                 f"{wall_s:.0f} s wall")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuts", type=int, default=1000)
    ap.add_argument("--only", default=",".join(COMPONENTS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-kind", type=int, default=None)
    args = ap.parse_args(argv)
    only = [c for c in args.only.split(",") if c]
    unknown = set(only) - set(COMPONENTS)
    if unknown:
        ap.error(f"--only: no component {', '.join(sorted(unknown))} (of {', '.join(COMPONENTS)})")
    t = time.monotonic()
    figures = run(args.cuts, only, args.seed, args.per_kind)
    print(report(figures, time.monotonic() - t))


if __name__ == "__main__":
    main()
