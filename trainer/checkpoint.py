"""Checkpoints: `epoch_E_step_S/` folders, the best one, and what a resume reads back.

A checkpoint holds the drafter's weights (`model.safetensors`, float32 so that a resume is
exact, without the target's embeddings and head, which stay the target's), its
`config.json` and `dflash.py` as trainer/contract.py describes them (loadable by SGLang,
z-lab and SpecForge; `fleetdeck-train export` makes the bfloat16 serving copy),
`distcp/` (torch.distributed.checkpoint: the weights and AdamW's state by parameter name, so
that a resume loads them into any number of processes, replicated or sharded),
`training_state.pt` (step, samples consumed, global batch, schedule, random state),
`metrics.json`, and after `evaluate` its `evaluation.json`. A folder appears whole or not
at all, and survives a power loss once saved: it is sealed (trainer/sealed.py: every file
fsynced, a sha256 manifest, the rename and its folder fsynced); a resume takes the newest
one that is still whole, saying which it skipped and why, and older ones are pruned only
after a new one is sealed.
`best.json` names the checkpoint with the highest held-out accept length.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file, save_file
from torch import nn

from agents.rundir.atomic import atomic_write, make_dirs
from trainer import contract, sealed
from trainer.contract import CONFIG, MODELING, WEIGHTS, ContractError, TargetFacts
from trainer.drafter import DFlashDraftModel

NAME = re.compile(r"^epoch_(\d+)_step_(\d+)$")
STATE = "training_state.pt"
# torch.distributed.checkpoint's folder: {"model": weights, "optim": AdamW's state}.
RESUME = "distcp"
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
    """Folders named as checkpoints, oldest first (whole or not: see `newest_good`)."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and NAME.match(p.name)]
    return sorted(found, key=step_of)


def problem(ckpt: Path, hashes: bool = True) -> str | None:
    """Why `ckpt` cannot be resumed from (None when it can): not whole as sealed, or, for a
    checkpoint from before sealing (no manifest), its weights or state missing."""
    if not sealed.is_sealed(ckpt):
        missing = [n for n in (WEIGHTS, STATE) if not (ckpt / n).is_file()]
        return f"not sealed and {', '.join(missing)} missing" if missing else None
    return sealed.check(ckpt, hashes)


@dataclass
class Found:
    """The newest checkpoint that can be resumed from, and the newer ones skipped (why)."""

    path: Path | None = None
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    unsealed: bool = False  # from before sealing: whole as far as can be told, not verified

    def said(self) -> str:
        return "; ".join(f"skipped {p.name}: {why}" for p, why in self.skipped)


def newest_good(folder: Path, hashes: bool = True) -> Found:
    found = Found()
    for ckpt in reversed(checkpoints(folder)):
        why = problem(ckpt, hashes)
        if why is None:
            found.path, found.unsealed = ckpt, not sealed.is_sealed(ckpt)
            return found
        found.skipped.append((ckpt, why))
    return found


def latest(folder: Path) -> Path | None:
    """The newest checkpoint that is whole (sizes checked, not hashes)."""
    return newest_good(folder, hashes=False).path


def read_best(folder: Path) -> Best | None:
    try:
        return msgspec.json.decode((folder / BEST).read_bytes(), type=Best)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_drafter(folder: Path, drafter: DFlashDraftModel, dtype: torch.dtype,
                  state: dict[str, torch.Tensor] | None = None) -> None:
    """Weights in `dtype` (the drafter's, or `state`: its full state dict when the drafter
    is sharded), config.json saying so, and the modeling file."""
    name = str(dtype).removeprefix("torch.")
    weights = {k: v.detach().to(dtype).contiguous().cpu()
               for k, v in (drafter.state_dict() if state is None else state).items()}
    save_file(weights, str(folder / WEIGHTS), metadata={"format": "pt"})
    config = contract.config_dict(drafter.config, name)
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    shutil.copyfile(contract.modeling_source(), folder / MODELING)


def save(folder: Path, epoch: int, step: int, drafter: DFlashDraftModel,
         state: dict[str, Any], metrics: Metrics,
         full: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None) -> Path:
    """Write the checkpoint and seal it; when this returns it survives a power loss. `full`:
    the drafter's full weights and optimizer state (trainer/sharding.py: full_state), which
    go to model.safetensors (the loaders') and distcp/ (the resume's); without it, the
    drafter's own weights and no optimizer state."""
    import torch.distributed.checkpoint as dcp

    make_dirs(folder)
    final = folder / name(epoch, step)
    tmp = folder / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    weights, optim = full if full is not None else (drafter.state_dict(), {})
    write_drafter(tmp, drafter, torch.float32, weights)
    # Written by this process alone, whole tensors: any layout reads its part back.
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message=".*single process")
        dcp.save({"model": weights, "optim": optim}, checkpoint_id=tmp / RESUME, no_dist=True)
    torch.save(state, tmp / STATE)
    (tmp / "metrics.json").write_bytes(msgspec.json.encode(metrics))
    sealed.commit(tmp, final)
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


def prune(folder: Path, keep_last: int, saved: Path | None = None) -> None:
    """Delete all but the newest `keep_last` checkpoints, the best and `saved` (the one just
    sealed: call this only after `save` returned), and what killed saves left behind."""
    best = read_best(folder)
    keep = {p.name for p in checkpoints(folder)[-keep_last:]}
    if saved is not None:
        keep.add(saved.name)
    if best is not None:
        keep.add(best.checkpoint)
    for p in checkpoints(folder):
        if p.name not in keep:
            sealed.remove(p)
    mine = f"-{os.getpid()}"
    for p in folder.iterdir():
        if p.is_dir() and p.name.startswith((".tmp-", ".old-", ".trash-")) \
                and not p.name.endswith(mine):
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
    if best is not None and problem(out / best.checkpoint, hashes=False) is None:
        return out / best.checkpoint
    found = newest_good(out, hashes=False)
    if found.path is None:
        why = f" ({found.said()})" if found.skipped else ""
        raise CheckpointError(f"{out}: no whole checkpoint yet{why}; run `fleetdeck-train "
                              "train` first")
    return found.path


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


def resume_files(ckpt: Path) -> dict[str, bytes]:
    """distcp/'s files by name (node rank 0 sends them to the other nodes)."""
    return {p.name: p.read_bytes() for p in sorted((ckpt / RESUME).iterdir()) if p.is_file()}


def load_resume(ckpt: Path, drafter: nn.Module, opt: torch.optim.Optimizer,
                folder: Path | None = None) -> None:
    """distcp/ of `ckpt` (or `folder`, a copy of it) into the drafter and AdamW, whatever
    the number of processes and whether the drafter is sharded: every process reads its
    part (a collective when there are several)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    source = folder if folder is not None else ckpt / RESUME
    model_sd, optim_sd = get_state_dict(drafter, opt)  # the layout to fill, here
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process")
            dcp.load(state, checkpoint_id=source)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{ckpt / RESUME}: cannot load: "
                              f"{str(exc).strip().splitlines()[0][:300]}") from None
    set_state_dict(drafter, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def load_state(ckpt: Path, data: bytes | None = None) -> dict[str, Any]:
    """training_state.pt of `ckpt` (or its bytes, `data`)."""
    try:
        source: Path | io.BytesIO = ckpt / STATE if data is None else io.BytesIO(data)
        state: dict[str, Any] = torch.load(source, weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{ckpt / STATE}: cannot read: {exc}") from None
    return state
