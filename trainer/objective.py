"""The DFlash objective on one batch: the drafter's blocks, the decayed loss, and the stats.

Loss: cross-entropy at block positions k = 1..B-1 against the token at anchor + k, weighted
by exp(-(k-1)/gamma) and the loss mask, normalised by the sum of weights. Stats (sums, so
that steps and ranks add up): per-position accuracy and the block-prefix accept length
(1 + the leading correct positions of a block), which on data the target generated
greedily is a close stand-in for speculative decoding's tau.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainer.blocks import (
    Anchors,
    block_labels,
    block_mask,
    block_tokens,
    flex_block_mask,
    position_ids,
)

# "sdpa": a dense boolean [b, 1, N*B, S + N*B] mask; "flex": flex_attention with a BlockMask
# from the same rule (no dense mask; CUDA only for training, torch has no flex backward on
# the CPU).
Attention = Literal["sdpa", "flex"]


def attention_for(device: torch.device) -> Attention:
    return "flex" if device.type == "cuda" else "sdpa"


@dataclass
class Batch:
    input_ids: torch.Tensor  # [b, S]
    loss_mask: torch.Tensor  # [b, S] bool
    attention_mask: torch.Tensor  # [b, S] long, 1 for real tokens
    lengths: torch.Tensor  # [b]

    def to(self, device: torch.device) -> Batch:
        return Batch(self.input_ids.to(device), self.loss_mask.to(device),
                     self.attention_mask.to(device), self.lengths.to(device))


class BlockStats:
    """Sums over blocks: weighted loss, correct and counted labels per position, accept."""

    def __init__(self, block_size: int) -> None:
        # [loss_sum, weight_sum, accept_sum, blocks, tokens, correct[B], counted[B]]
        self.values = torch.zeros(5 + 2 * block_size, dtype=torch.float64)
        self.block_size = block_size

    def add(self, other: BlockStats) -> None:
        self.values += other.values

    @property
    def correct(self) -> torch.Tensor:
        return self.values[5: 5 + self.block_size]

    @property
    def counted(self) -> torch.Tensor:
        return self.values[5 + self.block_size:]

    @property
    def tokens(self) -> int:
        return int(self.values[4])

    @property
    def loss(self) -> float | None:
        w = float(self.values[1])
        return float(self.values[0]) / w if w > 0 else None

    @property
    def accuracy(self) -> list[float]:
        """Accuracy at block positions 1..B-1."""
        c, n = self.correct[1:], self.counted[1:]
        return [float(a) / float(b) if b > 0 else 0.0 for a, b in zip(c, n, strict=True)]

    @property
    def accept_length(self) -> float | None:
        blocks = float(self.values[3])
        return float(self.values[2]) / blocks if blocks > 0 else None


def accept_lengths(correct: torch.Tensor, labelled: torch.Tensor) -> torch.Tensor:
    """[b, N]: 1 + the leading run of correct, labelled positions k = 1..B-1 per block."""
    ok = (correct & labelled)[:, :, 1:].long()
    return 1 + ok.cumprod(dim=2).sum(dim=2)


def block_loss(drafter: nn.Module, embed: nn.Module, head: nn.Module,
               feats: torch.Tensor, batch: Batch, anchors: Anchors, mask_token_id: int,
               weights: torch.Tensor, attention: Attention = "sdpa",
               ) -> tuple[torch.Tensor, BlockStats]:
    """The weighted loss of one batch (a scalar with a graph) and its stats."""
    block_size = weights.shape[0]
    ids = batch.input_ids
    s = ids.shape[1]
    pos = anchors.positions.to(ids.device)
    anchors = Anchors(pos, anchors.valid.to(ids.device))
    noise = embed(block_tokens(ids, pos, block_size, mask_token_id))
    # Padded anchor slots (valid False) are not masked out: their blocks see themselves,
    # carry no loss and nobody sees them, and no query row is empty (an empty row is NaN
    # on some SDPA backends).
    build = flex_block_mask if attention == "flex" else block_mask
    hidden = drafter(position_ids=position_ids(pos, s, block_size),
                     attention_mask=build(pos, None, s, block_size), noise_embedding=noise,
                     target_hidden=feats)
    labels, w = block_labels(ids, batch.loss_mask, batch.lengths, anchors, weights)
    flat_w = w.flatten()
    sel = flat_w > 0
    stats = BlockStats(block_size)
    stats.values[4] = float(batch.lengths.sum())
    correct = torch.zeros_like(sel)
    if bool(sel.any()):
        # The LM head only where there is a label: most of a padded batch has none.
        logits = head(hidden.reshape(-1, hidden.shape[-1])[sel]).float()
        target = labels.flatten()[sel]
        ce = F.cross_entropy(logits, target, reduction="none")
        wsel = flat_w[sel]
        loss = (ce * wsel).sum() / wsel.sum()
        correct[sel] = logits.argmax(dim=-1) == target
        stats.values[0] = float((ce.detach() * wsel).sum())
        stats.values[1] = float(wsel.sum())
    else:
        # Keep the graph: under DDP every rank's backward must reach every parameter.
        loss = hidden.sum() * 0.0
    labelled = w > 0
    correct3 = correct.view_as(labelled)
    acc_len = accept_lengths(correct3, labelled)
    blocks = anchors.valid & labelled[:, :, 1]
    stats.values[2] = float(acc_len[blocks].sum())
    stats.values[3] = float(blocks.sum())
    stats.values[5: 5 + block_size] = correct3.sum(dim=(0, 1)).double().cpu()
    stats.values[5 + block_size:] = labelled.sum(dim=(0, 1)).double().cpu()
    return loss, stats
