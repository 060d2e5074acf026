"""Training geometry: the block mask, label alignment, loss weights, anchors, empty masks.

Each test would catch one of the bugs reference/dflash.md lists: labels shifted by one
(SpecForge #455), a mask that lets blocks see each other or the anchor's own feature,
weights on the anchor, a silently empty loss.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainer.blocks import (
    Anchors,
    anchor_candidates,
    block_labels,
    block_mask,
    block_positions,
    block_tokens,
    default_gamma,
    position_ids,
    position_weights,
    sample_anchors,
)
from trainer.objective import Batch, block_loss


def test_mask_context_before_anchor_own_block_both_ways_never_another_block() -> None:
    anchors = torch.tensor([[3, 7], [0, 5]])
    keep = torch.tensor([[True, True], [True, False]])
    s, bsz = 10, 4
    mask = block_mask(anchors, None, s, bsz)
    kept = block_mask(anchors, keep, s, bsz)
    assert mask.shape == (2, 1, 2 * bsz, s + 2 * bsz) and mask.dtype == torch.bool
    for r in range(2):
        for q in range(2 * bsz):
            qb = q // bsz
            for key in range(s + 2 * bsz):
                # Context strictly before the anchor (not the anchor itself); in the blocks,
                # its own, earlier and later tokens alike.
                want = key < int(anchors[r, qb]) if key < s else (key - s) // bsz == qb
                assert bool(mask[r, 0, q, key]) == want, (r, q, key)
                # A block not kept (a padding slot) sees nothing, as in SpecForge.
                assert bool(kept[r, 0, q, key]) == (want and bool(keep[r, qb])), (r, q, key)


def test_block_inputs_and_positions() -> None:
    ids = torch.arange(100, 120)[None]
    anchors = torch.tensor([[2, 9]])
    tokens = block_tokens(ids, anchors, 4, mask_token_id=7)
    assert tokens.tolist() == [[102, 7, 7, 7, 109, 7, 7, 7]]
    assert block_positions(anchors, 4).tolist() == [[2, 3, 4, 5, 9, 10, 11, 12]]
    assert position_ids(anchors, 5, 4).tolist() == [[0, 1, 2, 3, 4,
                                                     2, 3, 4, 5, 9, 10, 11, 12]]


def test_label_k_is_the_token_at_anchor_plus_k() -> None:
    ids = torch.arange(100, 120)[None]
    lengths = torch.tensor([20])
    loss_mask = torch.ones(1, 20, dtype=torch.bool)
    anchors = Anchors(torch.tensor([[2, 9]]), torch.tensor([[True, True]]))
    labels, w = block_labels(ids, loss_mask, lengths, anchors, position_weights(4, 7.0))
    assert labels.tolist() == [[[102, 103, 104, 105], [109, 110, 111, 112]]]
    assert (w[..., 0] == 0).all(), "the anchor (k = 0) carries no loss"
    assert (w[..., 1:] > 0).all()


def test_labels_past_the_end_or_unsupervised_weigh_nothing() -> None:
    ids = torch.arange(100, 110)[None]
    loss_mask = torch.zeros(1, 10, dtype=torch.bool)
    loss_mask[0, 5:] = True
    loss_mask[0, 7] = False
    anchors = Anchors(torch.tensor([[6, 0]]), torch.tensor([[True, False]]))
    _, w = block_labels(ids, loss_mask, torch.tensor([9]), anchors, position_weights(4, 7.0))
    assert w[0, 0].tolist() == [0.0, 0.0, pytest.approx(math.exp(-1 / 7)), 0.0]
    assert (w[0, 1] == 0).all(), "an invalid anchor weighs nothing"


class PositionOracle(nn.Module):
    """A 'drafter' whose output at a block token is one-hot in its absolute position."""

    def __init__(self, s: int) -> None:
        super().__init__()
        self.s = s
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, position_ids, attention_mask, noise_embedding, target_hidden):
        blocks = position_ids[:, target_hidden.shape[1]:].clamp(max=self.s - 1)
        return nn.functional.one_hot(blocks, self.s).float() * self.scale


def test_a_drafter_that_predicts_the_token_at_its_position_is_always_right() -> None:
    """The whole objective, composed: if position k's output is the token at anchor + k,
    accuracy is 1 and every block accepts all its labels (a block at the end has fewer).
    Labels shifted by one would score 0."""
    s, bsz, vocab = 40, 8, 64
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab - 1, (2, s), generator=gen)
    loss_mask = torch.zeros(2, s, dtype=torch.bool)
    loss_mask[:, 10:] = True
    lengths = torch.tensor([s, s - 5])
    batch = Batch(ids, loss_mask, torch.ones(2, s, dtype=torch.long), lengths)
    anchors = sample_anchors(loss_mask, lengths, 16, bsz, gen)
    # The head reads the position and answers that position's token (row 0's tokens; row 1
    # gets its own oracle below).
    for row in range(2):
        head = nn.Linear(s, vocab, bias=False)
        with torch.no_grad():
            head.weight.zero_()
            head.weight[ids[row], torch.arange(s)] = 10.0
        one = Batch(ids[row: row + 1], loss_mask[row: row + 1], batch.attention_mask[:1],
                    lengths[row: row + 1])
        a = Anchors(anchors.positions[row: row + 1], anchors.valid[row: row + 1])
        _, stats = block_loss(PositionOracle(s), nn.Embedding(vocab, 4), head,
                              torch.zeros(1, s, 4), one, a, vocab - 1,
                              position_weights(bsz, default_gamma(bsz)))
        assert stats.accuracy == [1.0] * (bsz - 1)
        ends = a.positions[a.valid].tolist()
        assert any(p > int(lengths[row]) - bsz for p in ends), "blocks reach past the end"
        full = [1 + min(bsz - 1, int(lengths[row]) - 1 - p) for p in ends]
        assert stats.accept_length == pytest.approx(sum(full) / len(full))


def test_position_weights_decay_from_position_one() -> None:
    w = position_weights(16, 7.0)
    assert w[0] == 0.0 and w[1] == 1.0
    for k in range(1, 16):
        assert float(w[k]) == pytest.approx(math.exp(-(k - 1) / 7.0))
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)


def test_loss_is_normalised_by_the_weights() -> None:
    """A head that knows nothing (uniform logits) has loss ln V whatever the weights."""
    s, bsz, vocab = 30, 4, 50
    ids = torch.randint(0, vocab, (1, s))
    mask = torch.ones(1, s, dtype=torch.bool)
    batch = Batch(ids, mask, torch.ones(1, s, dtype=torch.long), torch.tensor([s]))
    anchors = sample_anchors(mask, batch.lengths, 8, bsz, torch.Generator().manual_seed(1))
    head = nn.Linear(s, vocab, bias=False)
    nn.init.zeros_(head.weight)
    loss, stats = block_loss(PositionOracle(s), nn.Embedding(vocab, 4), head,
                             torch.zeros(1, s, 4), batch, anchors, 0, position_weights(bsz, 7.0))
    assert float(loss.detach()) == pytest.approx(math.log(vocab), rel=1e-5)
    assert stats.loss == pytest.approx(math.log(vocab), rel=1e-5)


def test_anchors_on_supervised_tokens_whose_next_is_supervised_redrawn_each_step() -> None:
    s, bsz = 60, 8
    mask = torch.zeros(3, s, dtype=torch.bool)
    mask[0, 20:] = True
    mask[1, 5:15] = True
    mask[1, 40:] = True
    lengths = torch.tensor([60, 55, 0])
    draws = []
    for seed in (1, 2):
        a = sample_anchors(mask, lengths, 12, bsz, torch.Generator().manual_seed(seed))
        for r in range(3):
            pos = a.positions[r][a.valid[r]]
            assert len(pos) <= 12 and len(set(pos.tolist())) == len(pos)
            assert all(bool(mask[r, p]) and bool(mask[r, p + 1]) and p + 1 < lengths[r]
                       for p in pos.tolist())
        assert a.valid[0].sum() == 12 and a.valid[2].sum() == 0
        draws.append(a.positions[0].tolist())
    assert draws[0] != draws[1], "anchors are drawn again every step"
    again = sample_anchors(mask, lengths, 12, bsz, torch.Generator().manual_seed(1))
    assert again.positions[0].tolist() == draws[0], "and reproducibly from the seed"


def test_an_empty_loss_mask_gives_zero_loss_and_a_working_backward() -> None:
    s, bsz, vocab = 20, 4, 30
    mask = torch.zeros(1, s, dtype=torch.bool)
    batch = Batch(torch.randint(0, vocab, (1, s)), mask, torch.ones(1, s, dtype=torch.long),
                  torch.tensor([s]))
    anchors = sample_anchors(mask, batch.lengths, 8, bsz, torch.Generator().manual_seed(0))
    assert not anchors.valid.any() and anchors.positions.shape == (1, 1)
    drafter = PositionOracle(s)
    loss, stats = block_loss(drafter, nn.Embedding(vocab, 4), nn.Linear(s, vocab),
                             torch.zeros(1, s, 4), batch, anchors, 0, position_weights(bsz, 7.0))
    loss.backward()
    assert float(loss.detach()) == 0.0 and drafter.scale.grad is not None
    assert stats.loss is None and stats.accept_length is None


def test_short_answers_train_their_last_tokens_at_early_block_positions() -> None:
    """An answer shorter than a block: with the default rule every token of it but the
    first is a label at block position 1 (the end of turn included); the part of a block
    past the end weighs nothing. The old rule ("whole_block") finds no anchor at all."""
    bsz, answer = 16, 6
    prompt = 20
    s = prompt + answer
    ids = torch.arange(100, 100 + s)[None]
    loss_mask = torch.zeros(1, s, dtype=torch.bool)
    loss_mask[0, prompt:] = True  # ..., the last token is <|im_end|>'s newline
    lengths = torch.tensor([s])
    assert not anchor_candidates(loss_mask[0], s, bsz, "whole_block").any()
    cand = anchor_candidates(loss_mask[0], s, bsz)
    assert torch.nonzero(cand).flatten().tolist() == list(range(prompt, s - 1))
    anchors = sample_anchors(loss_mask, lengths, 512, bsz, torch.Generator().manual_seed(0))
    assert anchors.positions[0].tolist() == list(range(prompt, s - 1))
    labels, w = block_labels(ids, loss_mask, lengths, anchors, position_weights(bsz, 7.0))
    # Block position 1 of each anchor is the next token, down to the very last one.
    assert labels[0, :, 1].tolist() == list(range(100 + prompt + 1, 100 + s))
    assert (w[0, :, 1] == 1.0).all()
    for n, a in enumerate(range(prompt, s - 1)):
        inside = s - a  # block positions 0..inside-1 are inside the sequence
        assert (w[0, n, 1:inside] > 0).all() and (w[0, n, inside:] == 0).all(), a
    old = sample_anchors(loss_mask, lengths, 512, bsz, torch.Generator().manual_seed(0),
                         "whole_block")
    assert not old.valid.any()
    with pytest.raises(ValueError, match="anchor rule 'late'"):
        anchor_candidates(loss_mask[0], s, bsz, "late")  # type: ignore[arg-type]
