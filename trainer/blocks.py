"""The geometry of DFlash training: anchors, block tokens, positions, the mask, the labels.

For a sequence of S tokens and N anchors, the drafter gets N blocks of B tokens
`[token[anchor], MASK x (B-1)]` at positions anchor..anchor+B-1. Block i attends to the
context before its anchor (the anchor token itself has no target feature yet at inference:
it is the bonus token) and to its own B tokens both ways; never to another block. The label
of block position k is the token at anchor + k (k = 0, the anchor, carries no loss),
weighted by exp(-(k-1)/gamma) and by the loss mask at the label's position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# The DFlash paper's decay per block size; other sizes fall back to B=16's.
GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return GAMMA_BY_BLOCK.get(block_size, 7.0)


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B]: 0 for the anchor, then exp(-(k-1)/gamma) for k = 1..B-1."""
    w = torch.tensor([math.exp(-(k - 1) / gamma) for k in range(block_size)])
    w[0] = 0.0
    return w


@dataclass(frozen=True)
class Anchors:
    positions: torch.Tensor  # [b, N] long (0 where not valid)
    valid: torch.Tensor  # [b, N] bool


def sample_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, max_anchors: int,
                   block_size: int, generator: torch.Generator) -> Anchors:
    """Up to `max_anchors` distinct anchors per row, drawn at random among positions with
    loss (where the answer is) and with room for a whole block (anchor <= length - B)."""
    b, s = loss_mask.shape
    pos = torch.arange(s)
    rows: list[torch.Tensor] = []
    for r in range(b):
        ok = loss_mask[r].cpu().bool() & (pos <= int(lengths[r]) - block_size)
        cand = pos[ok]
        pick = torch.randperm(len(cand), generator=generator)[:max_anchors]
        rows.append(cand[pick].sort().values)
    # At least one (invalid) anchor, so that a batch without any still runs the drafter:
    # under DDP every rank must take part in the backward.
    n = max(1, max(len(x) for x in rows))
    positions = torch.zeros(b, n, dtype=torch.long)
    valid = torch.zeros(b, n, dtype=torch.bool)
    for r, x in enumerate(rows):
        positions[r, : len(x)] = x
        valid[r, : len(x)] = True
    return Anchors(positions, valid)


def block_offsets(block_size: int, device: torch.device | None = None) -> torch.Tensor:
    return torch.arange(block_size, device=device)


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[b, N*B]: anchor + k, the absolute positions of the block tokens."""
    k = block_offsets(block_size, anchors.device)
    return (anchors[:, :, None] + k).flatten(1)


def block_tokens(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                 mask_token_id: int) -> torch.Tensor:
    """[b, N*B]: the anchor's own token, then the mask token."""
    b, n = anchors.shape
    out = torch.full((b, n, block_size), mask_token_id, dtype=input_ids.dtype,
                     device=input_ids.device)
    out[:, :, 0] = torch.gather(input_ids, 1, anchors)
    return out.flatten(1)


def block_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[b, 1, N*B, S + N*B] bool, True where a query may attend.

    Keys are the S context positions, then the N*B block tokens in block order.
    """
    b, n = anchors.shape
    q_block = torch.arange(n * block_size, device=anchors.device) // block_size  # [Q]
    ctx_pos = torch.arange(context_len, device=anchors.device)
    q_anchor = anchors.repeat_interleave(block_size, dim=1)  # [b, Q]
    sees_ctx = ctx_pos[None, None, :] < q_anchor[:, :, None]  # [b, Q, S]
    same_block = q_block[:, None] == q_block[None, :]  # [Q, Q]
    sees_blocks = same_block[None].expand(b, -1, -1)
    return torch.cat([sees_ctx, sees_blocks], dim=2)[:, None]


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor,
                 anchors: Anchors, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """labels [b, N, B] (the token at anchor + k) and loss weights [b, N, B].

    A weight is zero at k = 0, past the sequence's end, where the label carries no loss
    and for invalid anchors.
    """
    block_size = weights.shape[0]
    pos = anchors.positions[:, :, None] + block_offsets(block_size, input_ids.device)
    inside = pos < lengths[:, None, None]
    safe = pos.clamp(max=input_ids.shape[1] - 1)
    b = input_ids.shape[0]
    labels = torch.gather(input_ids, 1, safe.view(b, -1)).view_as(pos)
    supervised = torch.gather(loss_mask.float(), 1, safe.view(b, -1)).view_as(pos)
    w = weights.to(input_ids.device)[None, None, :] * supervised * inside
    w = w * anchors.valid[:, :, None]
    return labels, w
