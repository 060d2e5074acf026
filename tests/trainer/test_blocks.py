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
    block_labels,
    block_mask,
    block_positions,
    block_tokens,
    default_gamma,
    position_weights,
    sample_anchors,
)
from trainer.objective import Batch, block_loss


def test_mask_context_before_anchor_own_block_both_ways_never_another_block() -> None:
    anchors = torch.tensor([[3, 7], [0, 5]])
    s, bsz = 10, 4
    mask = block_mask(anchors, s, bsz)
    assert mask.shape == (2, 1, 2 * bsz, s + 2 * bsz) and mask.dtype == torch.bool
    for r in range(2):
        for q in range(2 * bsz):
            qb = q // bsz
            for key in range(s + 2 * bsz):
                # Context strictly before the anchor (not the anchor itself); in the blocks,
                # its own, earlier and later tokens alike.
                want = key < int(anchors[r, qb]) if key < s else (key - s) // bsz == qb
                assert bool(mask[r, 0, q, key]) == want, (r, q, key)


def test_block_inputs_and_positions() -> None:
    ids = torch.arange(100, 120)[None]
    anchors = torch.tensor([[2, 9]])
    tokens = block_tokens(ids, anchors, 4, mask_token_id=7)
    assert tokens.tolist() == [[102, 7, 7, 7, 109, 7, 7, 7]]
    assert block_positions(anchors, 4).tolist() == [[2, 3, 4, 5, 9, 10, 11, 12]]


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

    def forward(self, noise, feats, positions, ctx_positions, mask):
        return nn.functional.one_hot(positions, self.s).float() * self.scale


def test_a_drafter_that_predicts_the_token_at_its_position_is_always_right() -> None:
    """The whole objective, composed: if position k's output is the token at anchor + k,
    accuracy is 1 and every block accepts fully. Labels shifted by one would score 0."""
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
        assert stats.accept_length == bsz


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


def test_anchors_on_answer_positions_with_room_for_a_block_redrawn_each_step() -> None:
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
            assert all(bool(mask[r, p]) and p <= lengths[r] - bsz for p in pos.tolist())
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
