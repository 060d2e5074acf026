"""The DFlash objective on one batch: the drafter's blocks, the decayed loss, and the stats.

Loss: cross-entropy at block positions k = 1..B-1 against the token at anchor + k, weighted
by exp(-(k-1)/gamma) and the loss mask, normalised by the sum of weights. Stats (sums, so
that steps and ranks add up): per-position accuracy and the block-prefix accept length
(1 + the leading correct positions of a block), which on data the target generated
greedily is a close stand-in for speculative decoding's tau.

The LM head never runs over all labelled positions at once: at 4 x 512 anchors x 15
positions and a 151,936 vocabulary that is ~18.7 GB of fp32 logits, two to three times that
with log-softmax and its gradient. `head_cross_entropy` applies it `chunk` positions at a
time and computes each chunk's gradient while its logits exist, keeping only that gradient
(the size of the hidden states) for the backward (the value and gradient are the one-piece
loss's, tests/trainer/test_objective.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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


# Labelled positions per chunk of the LM head: 1,024 x 151,936 fp32 logits are 0.6 GB, and
# their log-softmax and gradient about twice that again ([train] loss_chunk).
DEFAULT_LOSS_CHUNK = 1024


class _ChunkedHeadLoss(torch.autograd.Function):
    """sum(w * CE(hidden @ W.T + b, target)), a chunk of rows at a time. The loss is a sum of
    per-row terms, so each chunk's gradient to `hidden` ((softmax - onehot) * w, through W)
    is known in the forward: it is computed there, while the chunk's logits exist, and only
    it ([n, H], the size of `hidden`) is kept for the backward, which scales it. The FLOPs
    are the one-piece loss's (no recompute); W is frozen (no gradient)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, target: torch.Tensor, w: torch.Tensor,
                chunk: int, want_grad: bool,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        # Not ctx.needs_input_grad: it is True under no_grad too (evaluation needs none).
        grad = torch.empty_like(hidden) if want_grad else None
        ce = torch.empty(n, dtype=torch.float32, device=hidden.device)
        hit = torch.empty(n, dtype=torch.bool, device=hidden.device)
        for a in range(0, n, chunk):
            h, t = hidden[a: a + chunk], target[a: a + chunk]
            # The head in the autocast dtype (bf16 on GPUs), the softmax in fp32.
            raw = F.linear(h, weight, bias)
            logits = raw.float()
            lse = torch.logsumexp(logits, dim=-1)
            ce[a: a + chunk] = lse - logits.gather(1, t[:, None]).squeeze(1)
            hit[a: a + chunk] = logits.argmax(dim=-1) == t
            if grad is not None:
                # d/dlogits of w * CE: w * (softmax - onehot), in place over the logits.
                g = logits.sub_(lse[:, None]).exp_()
                g[torch.arange(len(t), device=g.device), t] -= 1.0
                g.mul_(w[a: a + chunk, None])
                grad[a: a + chunk] = torch.matmul(g.to(raw.dtype), weight.to(raw.dtype))
            del raw, logits
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(ce, hit)
        return (ce * w).sum(), ce, hit

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, *unused: Any
                 ) -> tuple[torch.Tensor | None, None, None, None, None, None, None]:
        (grad,) = ctx.saved_tensors
        return (grad * grad_total.to(grad.dtype) if grad is not None else None,
                None, None, None, None, None, None)


def head_cross_entropy(hidden: torch.Tensor, head: nn.Module, target: torch.Tensor,
                       w: torch.Tensor, chunk: int = DEFAULT_LOSS_CHUNK,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sum(w * CE(head(hidden), target)) over the rows of `hidden` [n, H], with a graph to
    `hidden`, and each row's cross-entropy and argmax-correct (no graph), computed `chunk`
    rows at a time: never more than one chunk's logits exist. The head (the target's) is
    frozen."""
    if chunk < 1:
        raise ValueError(f"loss chunk: {chunk}, expected at least 1 position")
    if hidden.shape[0] == 0:
        raise ValueError("head_cross_entropy: no rows")
    weight: torch.Tensor = head.weight  # type: ignore[assignment]
    bias: torch.Tensor | None = getattr(head, "bias", None)
    total, ce, hit = _ChunkedHeadLoss.apply(hidden, weight.detach(),
                                            None if bias is None else bias.detach(),
                                            target, w, chunk,
                                            torch.is_grad_enabled() and hidden.requires_grad)
    return total, ce, hit


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
               loss_chunk: int = DEFAULT_LOSS_CHUNK) -> tuple[torch.Tensor, BlockStats]:
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
        # The LM head only where there is a label (most of a padded batch has none), and
        # a chunk of positions at a time.
        wsel = flat_w[sel]
        loss_sum, ce, hit = head_cross_entropy(hidden.reshape(-1, hidden.shape[-1])[sel],
                                               head, labels.flatten()[sel], wsel, loss_chunk)
        loss = loss_sum / wsel.sum()
        correct[sel] = hit
        stats.values[0] = float((ce * wsel).sum())
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
