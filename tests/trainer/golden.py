"""The golden DFlash fixture (tests/fixtures/dflash/, README.md there): the reference
DFlashDraftModel's weights under its own state_dict names, inputs and outputs."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import Qwen3Config

from trainer.drafter import DFlashDraftModel

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dflash"
CONFIG = FIXTURE / "config.json"
SPECFORGE_EXPORT_CONFIG = FIXTURE / "config.specforge-head-export.json"
# The fixture's README: float32 on the CPU, against the reference's stored outputs.
ATOL = 1e-5


@cache
def tensors() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "golden.safetensors"))


def weights() -> dict[str, torch.Tensor]:
    return {k: v for k, v in tensors().items() if not k.startswith(("case.", "target."))}


def case(name: str) -> dict[str, torch.Tensor]:
    prefix = f"case.{name}."
    return {k.removeprefix(prefix): v for k, v in tensors().items() if k.startswith(prefix)}


def model() -> DFlashDraftModel:
    """Our drafter with the reference's weights, loaded as they are (no renaming)."""
    m = DFlashDraftModel(Qwen3Config.from_json_file(str(CONFIG)))
    m.load_state_dict(weights(), strict=True)
    return m.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())
