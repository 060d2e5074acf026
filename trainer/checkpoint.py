"""Checkpoints: `epoch_E_step_S/` folders, the best one, and what a resume reads back.

A checkpoint holds the drafter's weights (`model.safetensors`, float32 so that a resume is
exact, without the target's embeddings and head, which stay the target's), its
`config.json` and `dflash.py` as trainer/contract.py describes them (loadable by SGLang,
z-lab and SpecForge; `fleetdeck-train export` makes the bfloat16 serving copy),
`training_state.pt` (step, optimizer, schedule, random state), `metrics.json`, and after
`evaluate` its `evaluation.json`. A folder appears whole or not at all (written under a
temporary name, then renamed). `best.json` names the checkpoint with the highest held-out
accept length.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import msgspec
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file, save_file
from torch import nn

from agents.rundir.atomic import atomic_write
from trainer import contract
from trainer.contract import CONFIG, MODELING, WEIGHTS, ContractError, TargetFacts
from trainer.drafter import DFlashDraftModel

NAME = re.compile(r"^epoch_(\d+)_step_(\d+)$")
STATE = "training_state.pt"
BEST = "best.json"
EVALUATION = "evaluation.json"


class CheckpointError(ValueError):
    pass


class Metrics(msgspec.Struct):
    step: int
    epoch: int
    loss: float | None
    accept_length: float | None
    heldout_accept_length: float | None
    heldout_accuracy: list[float]


class Best(msgspec.Struct):
    checkpoint: str
    step: int
    heldout_accept_length: float | None


def name(epoch: int, step: int) -> str:
    return f"epoch_{epoch}_step_{step}"


def step_of(path: Path) -> int:
    m = NAME.match(path.name)
    return int(m.group(2)) if m else -1


def checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and NAME.match(p.name)
             and (p / WEIGHTS).exists() and (p / STATE).exists()]
    return sorted(found, key=step_of)


def latest(folder: Path) -> Path | None:
    found = checkpoints(folder)
    return found[-1] if found else None


def read_best(folder: Path) -> Best | None:
    try:
        return msgspec.json.decode((folder / BEST).read_bytes(), type=Best)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_drafter(folder: Path, drafter: DFlashDraftModel, dtype: torch.dtype) -> None:
    """Weights in `dtype`, config.json saying so, and the modeling file."""
    name = str(dtype).removeprefix("torch.")
    weights = {k: v.detach().to(dtype).contiguous().cpu()
               for k, v in drafter.state_dict().items()}
    save_file(weights, str(folder / WEIGHTS), metadata={"format": "pt"})
    config = contract.config_dict(drafter.config, name)
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    shutil.copyfile(contract.modeling_source(), folder / MODELING)


def save(folder: Path, epoch: int, step: int, drafter: DFlashDraftModel,
         state: dict[str, Any], metrics: Metrics) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / name(epoch, step)
    tmp = folder / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_drafter(tmp, drafter, torch.float32)
    torch.save(state, tmp / STATE)
    (tmp / "metrics.json").write_bytes(msgspec.json.encode(metrics))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def update_best(folder: Path, ckpt: Path, metrics: Metrics) -> bool:
    """Record `ckpt` as the best when its held-out accept length beats the best so far
    (a run without held-out data keeps the latest)."""
    best = read_best(folder)
    new = metrics.heldout_accept_length
    if best is not None and (folder / best.checkpoint).is_dir():
        old = best.heldout_accept_length
        if new is None and old is not None:
            return False
        if new is not None and old is not None and new <= old:
            return False
    atomic_write(folder / BEST, msgspec.json.encode(Best(ckpt.name, metrics.step, new)))
    return True


def prune(folder: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints and the best."""
    best = read_best(folder)
    keep = {p.name for p in checkpoints(folder)[-keep_last:]}
    if best is not None:
        keep.add(best.checkpoint)
    for p in checkpoints(folder):
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def choose(out: Path, which: str) -> Path:
    """A folder, or "best" (best.json, else the latest) or "latest" (also "last")."""
    if which not in ("best", "latest", "last"):
        path = Path(which)
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such checkpoint folder")
        return path
    best = read_best(out) if which == "best" else None
    if best is not None and (out / best.checkpoint / WEIGHTS).exists():
        return out / best.checkpoint
    last = latest(out)
    if last is None:
        raise CheckpointError(f"{out}: no checkpoint yet; run `fleetdeck-train train` first")
    return last


def load_drafter(ckpt: Path, target: TargetFacts | None,
                 device: torch.device | None = None) -> DFlashDraftModel:
    """A checkpoint's drafter, after checking the folder against its target (problems name
    the file and the key)."""
    found = contract.problems(ckpt, target, full=False)
    if found:
        raise CheckpointError("; ".join(found))
    try:
        drafter = DFlashDraftModel(contract.load_config(ckpt))
    except (ContractError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{ckpt / CONFIG}: cannot build the drafter: {exc}") from None
    load_weights(ckpt, drafter)
    if device is not None:
        nn.Module.to(drafter, device)
    return drafter.eval()


def load_weights(ckpt: Path, drafter: nn.Module, data: bytes | None = None) -> None:
    """The weights of `ckpt` into `drafter`; from `data` (that file's bytes, as node rank 0
    sends them to the other nodes) when given."""
    try:
        weights = load_file(str(ckpt / WEIGHTS)) if data is None else load_bytes(data)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{ckpt / WEIGHTS}: cannot read: {exc}") from None
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{ckpt / WEIGHTS}: does not fit this drafter "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def load_state(ckpt: Path, data: bytes | None = None) -> dict[str, Any]:
    """training_state.pt of `ckpt` (or its bytes, `data`)."""
    try:
        source: Path | io.BytesIO = ckpt / STATE if data is None else io.BytesIO(data)
        state: dict[str, Any] = torch.load(source, weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{ckpt / STATE}: cannot read: {exc}") from None
    return state
