"""Greedy speculative decoding with a DFlash drafter, and the target's own greedy decoding.

A round (z-lab's dflash_generate at temperature 0): the drafter fills a block
`[last token, MASK x (B-1)]` in one pass from the target's features of every earlier
position; the target verifies the whole block in one forward; the longest prefix of drafts
that match the target's own argmax is accepted, plus the target's next token. tau is the
mean number of tokens a target forward produced. The output must equal the target's greedy
decoding; where it does not, the two top logits were nearly tied (see `compare`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.drafter import DFlashDraftModel, DraftCache
from trainer.target import (
    cache_kwarg,
    crop,
    embeddings,
    lm_head,
    new_cache,
    select_features,
)


@dataclass
class Decoded:
    tokens: list[int]
    # Tokens produced per target forward after the prefill (1 for plain greedy decoding).
    per_forward: list[int] = field(default_factory=list)
    # Gap between the two top logits at each generated position (greedy decoding only).
    gaps: list[float] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return sum(self.per_forward) / len(self.per_forward) if self.per_forward else 0.0


def _positions(start: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)[None]


def _gap(logits: torch.Tensor) -> float:
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


@torch.inference_mode()
def greedy(target: Any, prompt: torch.Tensor, max_new: int, stop: set[int]) -> Decoded:
    """The reference: one token per forward, with the KV cache."""
    kw = cache_kwarg(target)
    cache = new_cache(target)
    p = prompt.shape[1]
    out = target(input_ids=prompt, position_ids=_positions(0, p, prompt.device),
                 use_cache=True, logits_to_keep=1, **{kw: cache})
    result = Decoded([])
    while True:
        logits = out.logits[0, -1]
        tok = int(logits.argmax())
        result.tokens.append(tok)
        result.gaps.append(_gap(logits))
        if tok in stop or len(result.tokens) >= max_new:
            return result
        result.per_forward.append(1)
        out = target(input_ids=torch.tensor([[tok]], device=prompt.device),
                     position_ids=_positions(p + len(result.tokens) - 1, 1, prompt.device),
                     use_cache=True, **{kw: cache})


@torch.inference_mode()
def speculative(target: Any, drafter: DFlashDraftModel, prompt: torch.Tensor, max_new: int,
                stop: set[int], zero_context: bool = False) -> Decoded:
    """Speculative decoding; `zero_context` zeroes the target features the drafter sees
    (an ablation: a drafter that ignores its context drafts as well without them)."""
    device = prompt.device
    embed, head = embeddings(target), lm_head(target)
    kw = cache_kwarg(target)
    cache = new_cache(target)
    draft_cache = DraftCache()
    p = prompt.shape[1]
    out = target(input_ids=prompt, position_ids=_positions(0, p, device), use_cache=True,
                 output_hidden_states=True, **{kw: cache})
    first = int(out.logits[0, -1].argmax())
    result = Decoded([first])
    ids = drafter.target_layer_ids
    ctx = select_features(out.hidden_states, ids)
    ctx_start = 0
    start = p  # the position of the last token, which the target has not seen yet
    while first not in stop and len(result.tokens) < max_new:
        size = min(drafter.block_size, max_new - len(result.tokens) + 1)
        block = torch.full((1, size), drafter.mask_token_id, dtype=torch.long, device=device)
        block[0, 0] = result.tokens[-1]
        if size > 1:
            dtype = next(drafter.parameters()).dtype
            feats = torch.zeros_like(ctx) if zero_context else ctx
            hidden = drafter(position_ids=_positions(ctx_start, ctx.shape[1] + size, device),
                             noise_embedding=embed(block).to(dtype),
                             target_hidden=feats.to(dtype), past_key_values=draft_cache,
                             use_cache=True)
            # The cache keeps the context only; the block is drafted anew next round.
            draft_cache.crop(start)
            block[0, 1:] = head(hidden[:, 1:].to(head.weight.dtype)).argmax(dim=-1)[0]
        out = target(input_ids=block, position_ids=_positions(start, size, device),
                     use_cache=True, output_hidden_states=True, **{kw: cache})
        posterior = out.logits[0].argmax(dim=-1)
        matches = (block[0, 1:] == posterior[:-1]).long()
        accepted = int(matches.cumprod(dim=0).sum())
        new = [*block[0, 1: accepted + 1].tolist(), int(posterior[accepted])]
        for i, tok in enumerate(new):
            if tok in stop:
                new = new[: i + 1]
                break
        new = new[: max_new - len(result.tokens)]
        result.tokens.extend(new)
        result.per_forward.append(len(new))
        if new and new[-1] in stop:
            break
        # The target keeps the anchor and the accepted drafts; the next anchor is the
        # bonus token, which it has not seen yet.
        crop(cache, start + accepted + 1)
        ctx = select_features(out.hidden_states, ids)[:, : accepted + 1]
        ctx_start = start
        start += accepted + 1
    return result


@dataclass
class Comparison:
    equal: bool
    near_tie: bool
    first_difference: int | None


def compare(spec: Decoded, ref: Decoded, tie_margin: float) -> Comparison:
    """Equal, or different first where the reference's two top logits were within
    `tie_margin` (batched and one-token forwards round differently there)."""
    n = min(len(spec.tokens), len(ref.tokens))
    for i in range(n):
        if spec.tokens[i] != ref.tokens[i]:
            return Comparison(False, ref.gaps[i] <= tie_margin, i)
    if len(spec.tokens) == len(ref.tokens):
        return Comparison(True, False, None)
    return Comparison(False, False, n)
