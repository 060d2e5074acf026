"""Each durable write of the product on the forgetting filesystem: what a call returned as
written is there after a power loss, at every moment (record once, cut at every op), and
what a power loss leaves is always whole. One test per rule and component."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from agents.engine.durable import DurableAppend
from agents.engine.journal import Journal, failed
from agents.engine.store import BatchStore
from agents.rundir import secrets
from agents.rundir.atomic import AppendLog, fsync_dir, make_dirs
from agents.rundir.control import ensure_control, read_control, resize, update_control
from agents.rundir.schema import ManifestEntry
from console.artifacts.landing import Landing, finish_part, land_group
from console.artifacts.pull import Puller
from console.artifacts.sources import LocalSource
from tests.powerloss.crash import crash_states
from tests.powerloss.harness import ForgetfulDir
from trainer import checkpoint as ckpt
from trainer import sealed
from trainer.contract import DFlashSettings, drafter_config
from trainer.drafter import DFlashDraftModel

SHM = Path("/dev/shm")


def ops(fs: ForgetfulDir) -> int:
    """Ops in the log so far: a call that returned now is durable in every later cut."""
    return int(fs.stats()["ops"])


def line(index: int, attempt: int = 1) -> bytes:
    return json.dumps({"index": index, "attempt": attempt, "finish_reason": "stop",
                       "usage": {"prompt_tokens": 3, "completion_tokens": 5},
                       "content": "x" * (index % 7)}).encode() + b"\n"


def test_the_store_keeps_every_group_it_returned(forgetful_dir: ForgetfulDir,
                                                 tmp_path: Path) -> None:
    """completions/ (made at recovery), .done_indices and each .partial (made at their first
    open) are fsynced into their folders: a group write_group returned is there after a power
    loss at any later moment, its lines with it, and no index is recorded without a line."""
    store = BatchStore(forgetful_dir.path, batch_size=7, total=100)
    store.recover()
    returned: list[tuple[int, int]] = []  # (ops when it returned, last index of the group)
    for start in range(0, 40, 5):
        store.write_group([(i, 1, line(i)) for i in range(start, start + 5)])
        returned.append((ops(forgetful_dir), start + 4))
    store.close_open_batch()
    store.close()
    log = forgetful_dir.oplog()
    for state in crash_states(log, range(len(log) + 1), SHM / tmp_path.name):
        acked = max((last for at, last in returned if at <= state.k), default=-1)
        after = BatchStore(state.path, batch_size=7, total=100)
        rec = after.recover()
        assert all(i in after.done for i in range(acked + 1)), \
            f"cut at {state.k}: indices up to {acked} were returned, {rec.done} survive"
        keys = [json.loads(raw)["index"] for batch in sorted(state.path.glob("completions/c*"))
                for raw in batch.read_bytes().splitlines()]
        assert sorted(keys) == sorted(set(keys)), f"cut at {state.k}: a line twice"
        assert set(keys) == {i for i in range(100) if i in after.done}, state.k
        after.close()


@pytest.mark.parametrize("name", [".done_indices", "failures.jsonl", "uploads.jsonl",
                                  "ownership.jsonl"])
def test_a_durable_append_file_s_name_survives(forgetful_dir: ForgetfulDir, name: str) -> None:
    f = DurableAppend(forgetful_dir / name, "test")
    f.append(b"1\n")
    f.close()
    forgetful_dir.power_loss()
    assert (forgetful_dir / name).read_bytes() == b"1\n"


def test_the_journal_keeps_what_it_returned(forgetful_dir: ForgetfulDir) -> None:
    journal = Journal(forgetful_dir / "failures.jsonl")
    journal.recover()
    journal.append([failed(3, "timeout", "no answer", 3, 0)])
    journal.close()
    forgetful_dir.power_loss()
    again = Journal(forgetful_dir / "failures.jsonl")
    assert again.recover().last == {3: ("failed", 1, "timeout")}


def test_control_changes_and_their_audit_survive_at_every_cut(forgetful_dir: ForgetfulDir,
                                                             tmp_path: Path) -> None:
    run_dir = forgetful_dir / "run"
    run_dir.mkdir()
    fsync_dir(forgetful_dir.path)  # as `up` and the engine make a run dir
    ensure_control(run_dir, 8, 256)
    returned: list[tuple[int, int]] = []  # (ops when update_control returned, its rev)
    for level in (4, 16, 2, 32):
        c = update_control(run_dir, "resize", {"value": level},
                           lambda c, v=level: resize(c, v, None), by="tester")
        returned.append((ops(forgetful_dir), c.rev))
    log = forgetful_dir.oplog()
    for state in crash_states(log, range(len(log) + 1), SHM / tmp_path.name):
        acked = [rev for at, rev in returned if at <= state.k]
        here = state.path / "run"
        control = read_control(here) if here.exists() else None
        if not acked:
            continue
        assert control is not None and control.rev >= acked[-1], state.k
        audit = (here / "control.log.jsonl").read_bytes().splitlines()
        assert len(audit) >= len(acked), f"cut at {state.k}: {len(audit)} audit records"
        assert all(json.loads(a)["who"] == "tester" for a in audit)


def test_secrets_json_is_replaced_and_removed_durably(forgetful_dir: ForgetfulDir) -> None:
    run_dir = forgetful_dir.path
    secrets.write(run_dir, {"servers": {"api_key": "k1"}})
    forgetful_dir.power_loss()
    assert secrets.read(run_dir) == {"servers": {"api_key": "k1"}}
    secrets.write(run_dir, {"servers": {"api_key": "k2"}})
    forgetful_dir.power_loss()
    assert secrets.read(run_dir) == {"servers": {"api_key": "k2"}}
    secrets.write(run_dir, {})
    forgetful_dir.power_loss()
    assert secrets.read(run_dir) is None


def test_an_append_log_s_name_is_durable_before_its_lines(forgetful_dir: ForgetfulDir) -> None:
    path = forgetful_dir / "history.jsonl"
    log = AppendLog(path)
    log.append_durable(b'{"a": 1}\n')
    log.append(b'{"torn": ')  # a crash mid-append
    log.close()
    forgetful_dir.power_loss()
    assert path.read_bytes() == b'{"a": 1}\n'
    path.write_bytes(b'{"a": 1}\n{"to')  # a torn tail, as a crash on a real disk leaves
    AppendLog(path).append_durable(b'{"b": 2}\n')  # opening cuts it
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'


def _entries(source: Path) -> list[ManifestEntry]:
    out = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        data = path.read_bytes()
        out.append(ManifestEntry(path=path.relative_to(source).as_posix(), kind="other",
                                 size=len(data), mtime=0.0, mtime_ns=0,
                                 sha256=hashlib.sha256(data).hexdigest()))
    return out


def test_a_pulled_file_is_there_after_a_power_loss(forgetful_dir: ForgetfulDir,
                                                   tmp_path: Path) -> None:
    """finish_part, a group landed at once and Puller rename into folders they made: all
    fsynced."""
    part = forgetful_dir / "f.fdpart"
    part.write_bytes(b"abc")
    assert finish_part(part, forgetful_dir / "f", 3, hashlib.sha256(b"abc").hexdigest())
    group = forgetful_dir / "group"
    make_dirs(group / "deeper")
    blobs = {f"{folder}g{i}": os.urandom(100 + i) for i in range(5)
             for folder in ("", "deeper/")}
    items = []
    for name, data in blobs.items():
        (group / f"{name}.fdpart").write_bytes(data)
        items.append(Landing(group / f"{name}.fdpart", group / name, len(data),
                             hashlib.sha256(data).hexdigest()))
    assert land_group(items) == [True] * len(items)
    source = tmp_path / "node-run"
    for rel in ("completions/completions_000000.jsonl", "logs/generate.log", "progress.json"):
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_bytes(os.urandom(3000) + rel.encode())
    dest = forgetful_dir / "pull" / "node" / "run"
    report = asyncio.run(Puller(LocalSource(str(source)), dest).run(_entries(source)))
    assert report.ok and len(report.copied) == 3
    forgetful_dir.power_loss()
    assert (forgetful_dir / "f").read_bytes() == b"abc"
    for name, data in blobs.items():
        assert (group / name).read_bytes() == data, name
    for rel in report.copied:
        assert (dest / rel).read_bytes() == (source / rel).read_bytes(), rel


def _drafter() -> DFlashDraftModel:
    from tests.trainer.tinyworld import tiny_config

    torch.manual_seed(0)
    return DFlashDraftModel(drafter_config(tiny_config(64, layers=6), 1,
                                           DFlashSettings(4, 64, [1, 3]))).eval()


def _metrics(step: int) -> ckpt.Metrics:
    return ckpt.Metrics(step, 0, 1.0, 1.0, None, [])


def test_a_saved_checkpoint_survives_and_pruning_waits_for_it(forgetful_dir: ForgetfulDir,
                                                              tmp_path: Path) -> None:
    """Every cut of save + prune: a power loss leaves a whole checkpoint no older than the
    last save that returned, and a resume finds it."""
    out = forgetful_dir / "run" / "checkpoints"
    drafter = _drafter()
    returned: list[tuple[int, int]] = []
    for step in (1, 2, 3):
        path = ckpt.save(out, 0, step, drafter, {"step": step}, _metrics(step))
        ckpt.update_best(out, path, _metrics(step))
        ckpt.prune(out, 1)
        returned.append((ops(forgetful_dir), step))
    log = forgetful_dir.oplog()
    cuts = range(0, len(log) + 1, max(1, len(log) // 150))
    for state in crash_states(log, cuts, SHM / tmp_path.name):
        acked = max((s for at, s in returned if at <= state.k), default=0)
        found = ckpt.latest(state.path / "run" / "checkpoints")
        if acked == 0 and found is None:
            continue
        assert found is not None, f"cut at {state.k}: no checkpoint"
        assert ckpt.step_of(found) >= acked, f"cut at {state.k}: {found.name}"
        assert ckpt.load_state(found)["step"] == ckpt.step_of(found)


def test_resume_skips_a_broken_checkpoint_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "checkpoints"
    drafter = _drafter()
    for step in (1, 2, 3):
        ckpt.save(out, 0, step, drafter, {"step": step}, _metrics(step))
    newest = out / "epoch_0_step_3"
    with open(newest / ckpt.WEIGHTS, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 8)  # a flipped block: same size, other bytes
    (out / "epoch_0_step_2" / ckpt.STATE).unlink()
    found = ckpt.newest_good(out)
    assert found.path == out / "epoch_0_step_1"
    assert found.said() == ("skipped epoch_0_step_3: model.safetensors: sha256 differs from "
                            "the manifest; skipped epoch_0_step_2: training_state.pt: missing")
    # What a run left half written never counts: no manifest, another file, a torn manifest.
    (out / "epoch_0_step_4").mkdir()
    (out / "epoch_0_step_4" / ckpt.WEIGHTS).write_bytes(b"")
    assert ckpt.newest_good(out).path == out / "epoch_0_step_1"
    (out / "epoch_0_step_1" / sealed.MANIFEST).write_bytes(b'{"files": [')
    assert ckpt.newest_good(out).path is None
