"""The loss without full-vocabulary logits: the LM head a chunk of positions at a time, each
chunk's gradient computed while its logits exist. Same value, gradient and stats as the
one-piece loss (the head over every labelled position, then fp32 cross-entropy) on the
golden case."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tests.trainer import golden
from trainer.blocks import (
    Anchors,
    block_labels,
    block_mask,
    block_tokens,
    position_ids,
    position_weights,
)
from trainer.objective import Batch, block_loss, head_cross_entropy

BLOCK, MASK_ID = 4, 511


def _inputs() -> tuple[Batch, Anchors, torch.nn.Embedding, torch.nn.Linear, torch.Tensor]:
    c = golden.case("train")
    ids = c["input_ids"]
    b, s = ids.shape
    # A loss mask with holes, so that some block positions carry no label.
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[:, 1::5] = False
    batch = Batch(ids, mask, torch.ones_like(ids), torch.full((b,), s))
    embed = torch.nn.Embedding.from_pretrained(golden.tensors()["target.embed_tokens.weight"])
    torch.manual_seed(3)
    head = torch.nn.Linear(64, 512, bias=False).requires_grad_(False)
    return batch, Anchors(c["anchor_positions"], c["block_keep_mask"]), embed, head, c[
        "target_hidden"]


def _one_piece(drafter: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Today's loss before this change: the head over every labelled position at once."""
    batch, anchors, embed, head, feats = _inputs()
    s = batch.input_ids.shape[1]
    pos = anchors.positions
    hidden = drafter(position_ids=position_ids(pos, s, BLOCK),
                     attention_mask=block_mask(pos, None, s, BLOCK),
                     noise_embedding=embed(block_tokens(batch.input_ids, pos, BLOCK, MASK_ID)),
                     target_hidden=feats)
    labels, w = block_labels(batch.input_ids, batch.loss_mask, batch.lengths, anchors,
                             position_weights(BLOCK, 7.0))
    sel = w.flatten() > 0
    logits = head(hidden.reshape(-1, hidden.shape[-1])[sel]).float()
    target = labels.flatten()[sel]
    ce = F.cross_entropy(logits, target, reduction="none")
    wsel = w.flatten()[sel]
    return (ce * wsel).sum() / wsel.sum(), ce.detach(), logits.argmax(-1) == target


def _grads(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [1, 5, 7, 10_000])
def test_chunked_loss_equals_the_one_piece_loss_value_gradient_and_stats(chunk: int) -> None:
    ref_model, model = golden.model().train(), golden.model().train()
    ref_loss, ref_ce, ref_hit = _one_piece(ref_model)
    ref_loss.backward()
    batch, anchors, embed, head, feats = _inputs()
    loss, stats = block_loss(model, embed, head, feats, batch, anchors, MASK_ID,
                             position_weights(BLOCK, 7.0), "sdpa", loss_chunk=chunk)
    loss.backward()
    n = int(ref_ce.numel())
    assert n > 2 * 7, "the case must span several chunks"
    assert abs(float(loss.detach()) - float(ref_loss.detach())) <= 1e-5
    assert stats.loss is not None and abs(stats.loss - float(ref_loss.detach())) <= 1e-5
    # The stats count the same correct positions as the one-piece argmax.
    assert int(stats.correct.sum()) == int(ref_hit.sum())
    ref, got = _grads(ref_model), _grads(model)
    assert set(ref) == set(got) and len(got) > 10
    worst = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    assert worst <= 1e-5, worst
    assert any(float(g.abs().max()) > 1e-4 for g in got.values()), "gradients must flow"


def test_no_chunks_logits_are_kept_for_the_backward() -> None:
    """What autograd saves for the backward: with chunks, never a [rows, vocab] tensor."""
    torch.manual_seed(0)
    rows, width, vocab = 64, 16, 4096
    hidden = torch.randn(rows, width, requires_grad=True)
    head = torch.nn.Linear(width, vocab, bias=False).requires_grad_(False)
    target = torch.randint(0, vocab, (rows,))
    w = torch.rand(rows)
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, ce, hit = head_cross_entropy(hidden, head, target, w, chunk=8)
    assert not any(len(s) == 2 and s[1] == vocab for s in saved), saved
    loss.backward()
    assert hidden.grad is not None and ce.shape == (rows,) and hit.shape == (rows,)
    whole = (F.cross_entropy(head(hidden).float(), target, reduction="none") * w).sum()
    assert abs(float(whole) - float(loss)) <= 1e-4 * abs(float(whole))


def test_a_chunk_under_one_position_is_refused() -> None:
    with pytest.raises(ValueError, match="loss chunk: 0"):
        head_cross_entropy(torch.zeros(2, 4), torch.nn.Linear(4, 8), torch.zeros(2).long(),
                           torch.ones(2), chunk=0)


def test_without_gradients_the_same_loss_and_stats_and_no_graph() -> None:
    """Held-out evaluation runs under no_grad (where a custom Function's needs_input_grad is
    still True: the chunks must not compute a gradient nobody will use)."""
    torch.manual_seed(1)
    hidden = torch.randn(24, 16, requires_grad=True)
    head = torch.nn.Linear(16, 512, bias=False).requires_grad_(False)
    target = torch.randint(0, 512, (24,))
    w = torch.rand(24)
    with torch.no_grad(), FlopCounterMode(display=False) as without:
        loss, ce, hit = head_cross_entropy(hidden, head, target, w, chunk=5)
    assert not loss.requires_grad
    with FlopCounterMode(display=False) as with_grad:
        total, ce2, hit2 = head_cross_entropy(hidden, head, target, w, chunk=5)
    assert torch.equal(loss, total.detach()) and torch.equal(ce, ce2)
    assert torch.equal(hit, hit2)
    # The head's forward alone without a graph; with one, its gradient's matmul too.
    head_flops = 2 * 24 * 16 * 512
    assert without.get_total_flops() == head_flops
    assert with_grad.get_total_flops() == 2 * head_flops
