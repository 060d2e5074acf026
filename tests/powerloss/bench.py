"""The forgetting filesystem's overhead: small appends (+ fsync) per second on it, on tmpfs
(the baseline: memory, an fsync that does nothing) and on the real disk, in the same run.

    .venv/bin/python -m tests.powerloss.bench [--n 5000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tests.powerloss.harness import mount


def appends_per_s(folder: Path, n: int, sync: bool, size: int = 100) -> float:
    """n appends of `size` bytes to a new file in `folder`, each fsynced when `sync`."""
    fd = os.open(folder / f"bench-{sync}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = b"x" * (size - 1) + b"\n"
    try:
        start = time.perf_counter()
        for _ in range(n):
            os.write(fd, line)
            if sync:
                os.fsync(fd)
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)


def run(n: int) -> dict[str, dict[str, float]]:
    """{filesystem: {"append": ops/s, "append+fsync": ops/s}}."""
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="forgetfs-bench-") as d:
        fs = mount(Path(d) / "forgetful")
        try:
            targets = {"forgetfs": fs.path}
            with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
                targets["tmpfs"] = Path(shm)
                targets["disk"] = Path(d)
                for name, folder in targets.items():
                    out[name] = {"append": appends_per_s(folder, n, sync=False),
                                 "append+fsync": appends_per_s(folder, n, sync=True)}
        finally:
            fs.unmount()
    return out


def report(results: dict[str, dict[str, float]]) -> str:
    base = results["tmpfs"]
    lines = []
    for name, r in results.items():
        shown = ", ".join(f"{k} {v:,.0f}/s ({v / base[k]:.2f}x tmpfs)" for k, v in r.items())
        lines.append(f"{name:9} {shown}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=5000)
    print(report(run(p.parse_args().n)))


if __name__ == "__main__":
    main()
