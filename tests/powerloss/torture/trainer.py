"""The trainer's checkpoints under power loss: one recording of a tiny training run on the CPU
with a checkpoint every step (prepare, train 3 steps, then a real trainer SIGKILLed while it
writes a checkpoint, the power cut live and `--resume` to the end), and on each crash state
what a resume decides: the newest whole checkpoint (manifest sha256 checked), never older than
the last one saved before the cut, loadable; best.json naming one that is there; and
progress.json there whenever a checkpoint is (the supervisor's `--resume` depends on it)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from agents.rundir.schema import train_progress_decoder
from tests.powerloss.harness import REPO, ForgetfulDir
from tests.powerloss.oplog import Op
from tests.powerloss.torture.cuts import Figures, Violation, annotate, choose, cut_all
from tests.servers.ports import wait_until
from trainer import checkpoint as ckpt

STEPS = 8
SMALL = {"batch_size": 4, "anchors": 16, "drafter_layers": 1, "heldout_share": 0.1,
         "eval_samples": 4, "max_steps": STEPS, "save_every": 1, "keep_last": 2}


def train_cli(*args: str) -> int:
    """`fleetdeck-train` in this process (its output kept from the test's)."""
    from trainer.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(args))


def record(fs: ForgetfulDir, root: Path, live: bool = True) -> tuple[list[Op], dict[str, Any]]:
    """The run, recorded. live=False: no trainer process of its own is killed and no power
    cut live (a new process is a torch import, a minute on a loaded box)."""
    from tests.trainer.tinyworld import build_world, word_lines, write_batches, write_spec

    torch.set_num_threads(1)
    world = build_world(root / "target", teach_steps=0)
    write_batches(root / "data", word_lines(60))
    run_dir = fs / "run"
    spec = write_spec(root / "train.toml", str(root / "data"), world.target, run_dir, **SMALL)
    assert train_cli("prepare", str(spec)) == 0
    assert train_cli("train", str(spec), "--steps", "3") == 0
    out = run_dir / "checkpoints"
    if not live:
        assert train_cli("train", str(spec), "--resume") == 0
        return fs.oplog(), {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", "train", str(spec),
                             "--resume"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # Killed while it writes a checkpoint: its temporary folder is there.
        wait_until(lambda: proc.poll() is not None or any(
            p.name.startswith(".tmp-") and ckpt.step_of(Path(p.name[5:].rsplit("-", 1)[0])) >= 5
            for p in out.iterdir()), 240, "a checkpoint being written")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    before = [p.name for p in ckpt.checkpoints(out)]
    k = fs.power_loss()
    after = ckpt.newest_good(out)
    t = time.monotonic()
    assert train_cli("train", str(spec), "--resume") == 0
    p = train_progress_decoder.decode((run_dir / "progress.json").read_bytes())
    assert p.status == "done" and p.step == STEPS, p
    final = ckpt.newest_good(out)
    assert final.path is not None and ckpt.step_of(final.path) == STEPS
    live = {"at": k, "before": before, "resumed_from": after.path and after.path.name,
            "skipped": after.said(), "resume_s": time.monotonic() - t}
    return fs.oplog(), live


def torture(fs: ForgetfulDir, root: Path, cuts: int, seed: int,
            per_kind: int | None = None, live_cut: bool = True) -> Figures:
    from tests.powerloss.torture.cuts import SHM

    fig = Figures("trainer")
    t = time.monotonic()
    log, live = record(fs, root, live_cut)
    fig.record_s = time.monotonic() - t
    fig.ops = len(log)
    if live:
        fig.notes.append(f"trainer live cut at op {live['at']} (checkpoints then: "
                         f"{', '.join(live['before'])}): resumed from {live['resumed_from']}"
                         f"{'; ' + live['skipped'] if live['skipped'] else ''}")
    steps = annotate(log)
    out = "run/checkpoints"
    # A checkpoint is saved once renamed into place and its folder fsynced after.
    renamed: dict[str, int] = {}
    saved: list[tuple[int, int]] = []  # (cut from which it must be there, its step)
    for s in steps:
        if s.op.kind == "rename" and s.new_path.startswith(out + "/epoch_"):
            renamed[s.new_path] = s.index
        elif s.op.kind == "fsyncdir" and s.path == out:
            for path, at in list(renamed.items()):
                if at < s.index:
                    saved.append((s.index + 1, ckpt.step_of(Path(path))))
                    del renamed[path]
    renames = [s for s in steps if s.op.kind == "rename"]
    must = {"checkpoint renamed into place": [s.index + 1 for s in renames
                                              if s.new_path.startswith(out + "/epoch_")],
            "checkpoint saved": [at for at, _ in saved],
            "pruned": [s.index + 1 for s in renames if ".trash-" in s.new_path]}

    def check(k: int, folder: Path) -> dict[str, Any]:
        ckpts = folder / out
        acked = max((step for at, step in saved if at <= k), default=0)
        found = ckpt.newest_good(ckpts)
        if found.path is None:
            if acked:
                raise Violation(f"no checkpoint to resume from, step {acked} had been saved "
                                f"({found.said()})")
            return {"cuts before any checkpoint": 1}
        step = ckpt.step_of(found.path)
        if step < acked:
            raise Violation(f"resumes from step {step}, step {acked} had been saved")
        if ckpt.load_state(found.path)["step"] != step:
            raise Violation(f"{found.path.name}: training_state.pt is of another step")
        ckpt.load_drafter(found.path, None)
        best = ckpt.read_best(ckpts)
        if best is not None and ckpt.problem(ckpts / best.checkpoint, hashes=False):
            raise Violation(f"best.json names {best.checkpoint}: "
                            f"{ckpt.problem(ckpts / best.checkpoint, hashes=False)}")
        progress = folder / "run" / "progress.json"
        try:
            train_progress_decoder.decode(progress.read_bytes())
        except (OSError, ValueError) as exc:
            raise Violation(f"checkpoints but no readable progress.json ({exc}): the "
                            "supervisor would start the trainer without --resume") from None
        return {"resumed at step (sum)": step, "newer ones skipped": len(found.skipped)}

    points = choose(len(log), must, cuts, seed, per_kind)
    cut_all(fig, log, points, SHM / f"pl-trainer-{os.getpid()}", check)
    return fig
