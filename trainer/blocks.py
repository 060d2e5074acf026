"""The geometry of DFlash training: anchors, block tokens, positions, the mask, the labels.

For a sequence of S tokens and N anchors, the drafter gets N blocks of B tokens
`[token[anchor], MASK x (B-1)]` at positions anchor..anchor+B-1. Block i attends to the
context before its anchor (the anchor token itself has no target feature yet at inference:
it is the bonus token) and to its own B tokens both ways; never to another block. That rule
is written once (`mask_rule`) and gives both the dense mask for SDPA and flex_attention's
BlockMask. The label of block position k is the token at anchor + k (k = 0, the anchor,
carries no loss), weighted by exp(-(k-1)/gamma) and by the loss mask at the label's position;
labels past the sequence's end weigh nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

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


# Where an anchor may sit. "supervised_next" (SpecForge HEAD's `_sample_anchor_positions`, the
# default): on a supervised token whose next token is supervised too, so the last tokens of an
# answer, <|im_end|> included, are also trained at early block positions; the block's part
# past the end carries no loss. "whole_block" (the paper's first rule): also room for a
# whole block, anchor <= length - B.
AnchorRule = Literal["supervised_next", "whole_block"]
ANCHOR_RULES: tuple[AnchorRule, ...] = ("supervised_next", "whole_block")
DEFAULT_ANCHOR_RULE: AnchorRule = "supervised_next"


@dataclass(frozen=True)
class Anchors:
    positions: torch.Tensor  # [b, N] long (0 where not valid)
    valid: torch.Tensor  # [b, N] bool


def anchor_candidates(loss_mask: torch.Tensor, length: int, block_size: int,
                      rule: AnchorRule = DEFAULT_ANCHOR_RULE) -> torch.Tensor:
    """[S] bool: the positions of one row where an anchor may sit."""
    supervised = loss_mask.cpu().bool()
    pos = torch.arange(supervised.shape[0])
    if rule == "whole_block":
        return supervised & (pos <= length - block_size)
    if rule != "supervised_next":
        raise ValueError(f"anchor rule {rule!r}: one of {', '.join(ANCHOR_RULES)}")
    next_supervised = torch.zeros_like(supervised)
    next_supervised[:-1] = supervised[1:]
    return supervised & next_supervised & (pos + 1 < length)


def sample_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, max_anchors: int,
                   block_size: int, generator: torch.Generator,
                   rule: AnchorRule = DEFAULT_ANCHOR_RULE) -> Anchors:
    """Up to `max_anchors` distinct anchors per row, drawn at random among the positions
    `rule` allows."""
    b, _ = loss_mask.shape
    rows: list[torch.Tensor] = []
    for r in range(b):
        cand = torch.nonzero(anchor_candidates(loss_mask[r], int(lengths[r]), block_size,
                                               rule)).flatten()
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


def position_ids(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[b, S + N*B]: the context's positions 0..S-1, then each block's anchor + k."""
    ctx = torch.arange(context_len, device=anchors.device).expand(anchors.shape[0], -1)
    return torch.cat([ctx, block_positions(anchors, block_size)], dim=1)


def block_tokens(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                 mask_token_id: int) -> torch.Tensor:
    """[b, N*B]: the anchor's own token, then the mask token."""
    b, n = anchors.shape
    out = torch.full((b, n, block_size), mask_token_id, dtype=input_ids.dtype,
                     device=input_ids.device)
    out[:, :, 0] = torch.gather(input_ids, 1, anchors)
    return out.flatten(1)


MaskMod = Callable[[torch.Tensor, Any, torch.Tensor, torch.Tensor], torch.Tensor]


def mask_rule(anchors: torch.Tensor, keep: torch.Tensor | None, context_len: int,
              block_size: int) -> MaskMod:
    """The training mask as a flex_attention `mask_mod` (b, h, q, kv) -> may attend.

    Keys are the S context positions, then the N*B block tokens in block order. A query of
    block i sees context positions < anchor_i (strictly: at inference the anchor is the bonus
    token, whose features the target has not produced yet) and the tokens of block i both
    ways; no other block. With `keep`, a block whose keep is False sees nothing (SpecForge's
    `create_dflash_sdpa_mask` and `create_dflash_block_mask`).
    """
    n = anchors.shape[1]

    def mask_mod(b: torch.Tensor, h: Any, q_idx: torch.Tensor,
                 kv_idx: torch.Tensor) -> torch.Tensor:
        # flex pads the query range to its tile size: clamp, then drop the padding.
        q_block = q_idx // block_size
        safe = q_block.clamp(max=n - 1)
        sees_context = (kv_idx < context_len) & (kv_idx < anchors[b, safe])
        sees_block = (kv_idx >= context_len) & ((kv_idx - context_len) // block_size == q_block)
        allowed = (sees_context | sees_block) & (q_block < n)
        return allowed & keep[b, safe] if keep is not None else allowed

    return mask_mod


def block_mask(anchors: torch.Tensor, keep: torch.Tensor | None, context_len: int,
               block_size: int) -> torch.Tensor:
    """[b, 1, N*B, S + N*B] bool, True where a query may attend: `mask_rule` on every pair."""
    b, n = anchors.shape
    dev = anchors.device
    rule = mask_rule(anchors, keep, context_len, block_size)
    return rule(torch.arange(b, device=dev)[:, None, None, None], None,
                torch.arange(n * block_size, device=dev)[None, None, :, None],
                torch.arange(context_len + n * block_size, device=dev)[None, None, None, :])


def flex_block_mask(anchors: torch.Tensor, keep: torch.Tensor | None, context_len: int,
                    block_size: int, compile: bool | None = None) -> Any:
    """The same rule as a flex_attention BlockMask: only the tiles a block may see are
    computed. Compiled (the default on CUDA), building it never holds a dense [Q, S + Q]
    tensor either; eager, it evaluates the rule on every pair once."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, n = anchors.shape
    compiled = anchors.device.type == "cuda" if compile is None else compile
    return create_block_mask(mask_rule(anchors, keep, context_len, block_size), B=b, H=None,
                             Q_LEN=n * block_size, KV_LEN=context_len + n * block_size,
                             device=anchors.device, _compile=compiled)


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
