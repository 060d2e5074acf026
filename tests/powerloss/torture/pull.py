"""Pull under power loss: one recording of two pulls of a node's run dir into a destination on
the mount (the second after some of the node's files changed), and on each crash state the
pull again, as a user would run it: every file it had finished must still be whole, a file
under its final name is always a whole version, and the pull again ends with all of them."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from pathlib import Path
from typing import Any

from agents.rundir.schema import ManifestEntry
from console.artifacts.pull import PART_SUFFIX, Puller
from console.artifacts.pullset import pull_lock, save_manifest
from console.artifacts.sources import LocalSource
from tests.powerloss.harness import ForgetfulDir
from tests.powerloss.oplog import Op
from tests.powerloss.torture.cuts import Figures, Violation, annotate, choose, cut_all

DEST = "pull/node-1/run"


def make_node_run(folder: Path, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(12):
        (folder / "completions").mkdir(parents=True, exist_ok=True)
        size = rng.choice([0, 10, 4000, 70_000, 300_000])
        (folder / "completions" / f"completions_{i:06d}.jsonl").write_bytes(rng.randbytes(size))
    for rel in ("progress.json", "logs/generate.log", "logs/sglang_gpu0.log", "run.toml"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(rng.randbytes(rng.randrange(100, 20_000)))


def entries(source: Path) -> list[ManifestEntry]:
    out = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        data = path.read_bytes()
        out.append(ManifestEntry(path=path.relative_to(source).as_posix(), kind="other",
                                 size=len(data), mtime=0.0, mtime_ns=0,
                                 sha256=hashlib.sha256(data).hexdigest()))
    return out


def pull(source: Path, dest: Path) -> Any:
    """What pull_node does with the node's files, from a local copy of them."""
    with pull_lock(dest):
        found = entries(source)
        save_manifest(dest, found)
        return asyncio.run(Puller(LocalSource(str(source)), dest).run(found))


def torture(fs: ForgetfulDir, root: Path, cuts: int, seed: int,
            per_kind: int | None = None) -> Figures:
    from tests.powerloss.torture.cuts import SHM

    fig = Figures("pull")
    t = time.monotonic()
    source = root / "node-run"
    make_node_run(source, seed)
    versions: dict[str, set[str]] = {e.path: {e.sha256 or ""} for e in entries(source)}
    first = pull(source, fs / DEST)
    assert first.ok, first.failed
    for name in ("progress.json", "logs/generate.log", "completions/completions_000003.jsonl"):
        with open(source / name, "ab") as f:
            f.write(os.urandom(5000))
    for e in entries(source):
        versions[e.path].add(e.sha256 or "")
    second = pull(source, fs / DEST)
    assert second.ok and len(second.copied) == 3, second
    log: list[Op] = fs.oplog()
    fig.record_s = time.monotonic() - t
    fig.ops = len(log)
    steps = annotate(log)
    # A file is finished once renamed from its part and its folder fsynced after that.
    renamed: dict[str, int] = {}
    finished: list[tuple[int, str]] = []
    for s in steps:
        if s.op.kind == "rename" and s.path.endswith(PART_SUFFIX):
            renamed[s.new_path] = s.index
        elif s.op.kind == "fsyncdir":
            for path, at in list(renamed.items()):
                if path.rpartition("/")[0] == s.path and at < s.index:
                    finished.append((s.index + 1, path))
                    del renamed[path]
    must = {"renamed into place": [at + 1 for at in
                                   [s.index for s in steps if s.op.kind == "rename"]],
            "finished": [at for at, _ in finished]}

    def check(k: int, folder: Path) -> dict[str, Any]:
        dest = folder / DEST
        for at, path in finished:
            if at <= k and not (folder / path).exists():
                raise Violation(f"{path} was pulled, the power loss took it")
        kept = 0
        for rel, shas in versions.items():
            path = dest / rel
            if path.exists():
                if hashlib.sha256(path.read_bytes()).hexdigest() not in shas:
                    raise Violation(f"{rel}: under its final name but not a whole version")
                kept += 1
        again = pull(source, dest)
        if not again.ok or len(again.copied) + len(again.skipped) != len(versions):
            raise Violation(f"the pull again: {again.failed or again}")
        for e in entries(source):
            if hashlib.sha256((dest / e.path).read_bytes()).hexdigest() != e.sha256:
                raise Violation(f"{e.path}: differs from the node after the pull again")
        return {"files whole after the cut": kept, "fetched again": len(again.copied),
                "resumed parts": len(again.resumed)}

    points = choose(len(log), must, cuts, seed, per_kind)
    cut_all(fig, log, points, SHM / f"pl-pull-{os.getpid()}", check)
    return fig
