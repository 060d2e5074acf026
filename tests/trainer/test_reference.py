"""Parity with the reference DFlashDraftModel (z-lab/dflash) on the golden fixture.

The fixture's outputs come from the reference module (and SpecForge's, identical); its masks
from SpecForge's `create_dflash_sdpa_mask`. Our drafter takes the reference's weights under
their own names and must reproduce every case to 1e-5 in float32, and the training inputs
our code builds (block tokens, positions, mask, feature order) must equal the fixture's
exactly. A change of one architectural detail (k_norm, hidden_norm, feature order, position
ids, the mask) fails here even when training and evaluation still agree with each other.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.trainer import golden
from tests.trainer.golden import ATOL, max_diff
from trainer.blocks import (
    Anchors,
    block_mask,
    block_tokens,
    flex_block_mask,
    position_ids,
    position_weights,
)
from trainer.drafter import DraftCache
from trainer.objective import Attention, Batch, block_loss
from trainer.target import select_features

BLOCK = 4
MASK_ID = 511


def test_the_reference_weights_load_under_their_own_names() -> None:
    m = golden.model()
    assert set(m.state_dict()) == set(golden.weights())
    assert m.target_layer_ids == [1, 2, 3, 4, 5] and m.block_size == BLOCK
    assert m.mask_token_id == MASK_ID


def test_training_inputs_are_the_references() -> None:
    c = golden.case("train")
    anchors, keep = c["anchor_positions"], c["block_keep_mask"]
    s = c["input_ids"].shape[1]
    noise_ids = block_tokens(c["input_ids"], anchors, BLOCK, MASK_ID)
    assert torch.equal(noise_ids, c["noise_ids"])
    embed = golden.tensors()["target.embed_tokens.weight"]
    assert torch.equal(embed[noise_ids], c["noise_embedding"])
    assert torch.equal(position_ids(anchors, s, BLOCK), c["position_ids"])
    assert torch.equal(block_mask(anchors, keep, s, BLOCK), c["attention_mask"])
    # All blocks are kept in this case: the trainer's mask (keep None) is the same.
    assert torch.equal(block_mask(anchors, None, s, BLOCK), c["attention_mask"])


def test_our_mask_equals_specforges_with_a_padded_block() -> None:
    c = golden.case("mask")
    s, bsz = int(c["seq_len"]), int(c["block_size"])
    got = block_mask(c["anchor_positions"], c["block_keep_mask"], s, bsz)
    assert got.shape == c["attention_mask"].shape
    assert torch.equal(got, c["attention_mask"])
    assert not got[0, 0, 2 * bsz:].any(), "the padded block sees nothing"


def _train_forward(mask: object) -> torch.Tensor:
    c = golden.case("train")
    anchors = c["anchor_positions"]
    with torch.no_grad():
        return golden.model()(position_ids=position_ids(anchors, 12, BLOCK),
                              attention_mask=mask, noise_embedding=c["noise_embedding"],
                              target_hidden=c["target_hidden"])


def test_training_case_matches_the_reference() -> None:
    c = golden.case("train")
    got = _train_forward(block_mask(c["anchor_positions"], None, 12, BLOCK))
    assert max_diff(got, c["output"]) <= ATOL


def test_flex_attention_agrees_with_sdpa_and_the_reference() -> None:
    """The BlockMask comes from the same rule; flex runs forward-only on the CPU."""
    c = golden.case("train")
    anchors, keep = c["anchor_positions"], c["block_keep_mask"]
    flex = _train_forward(flex_block_mask(anchors, keep, 12, BLOCK))
    sdpa = _train_forward(block_mask(anchors, keep, 12, BLOCK))
    assert max_diff(flex, c["output"]) <= ATOL
    assert max_diff(flex, sdpa) <= ATOL


def test_features_are_concatenated_in_list_order_from_layer_plus_one() -> None:
    c = golden.case("infer1")
    hidden_states = tuple(c["hf_hidden_states"])  # index 0 = the embeddings
    got = select_features(hidden_states, [1, 2, 3, 4, 5])
    assert torch.equal(got, c["target_hidden"])


def test_two_inference_steps_with_a_cache_match_the_reference() -> None:
    """z-lab's dflash_generate: draft, crop the cache back to the context, draft again."""
    m = golden.model()
    one, two = golden.case("infer1"), golden.case("infer2")
    cache = DraftCache()
    with torch.no_grad():
        out1 = m(position_ids=one["position_ids"], noise_embedding=one["noise_embedding"],
                 target_hidden=one["target_hidden"], past_key_values=cache, use_cache=True)
        assert max_diff(out1, one["output"]) <= ATOL
        cache.crop(7)
        out2 = m(position_ids=two["position_ids"], noise_embedding=two["noise_embedding"],
                 target_hidden=two["target_hidden"], past_key_values=cache, use_cache=True)
        assert max_diff(out2, two["output"]) <= ATOL
        # The same step without a cache: the whole context at once.
        whole = m(position_ids=two["full_position_ids"], noise_embedding=two["noise_embedding"],
                  target_hidden=torch.cat([one["target_hidden"], two["target_hidden"]], dim=1))
        assert max_diff(whole, two["output"]) <= ATOL


class Recorder(torch.nn.Module):
    """The golden drafter, keeping what the objective passed it and what it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = golden.model()
        self.calls: list[tuple[dict[str, Any], torch.Tensor]] = []

    def forward(self, **kw: Any) -> torch.Tensor:
        out: torch.Tensor = self.inner(**kw)
        self.calls.append((kw, out))
        return out


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_the_training_objective_runs_the_reference_case(attention: Attention) -> None:
    """block_loss, as training calls it, gives the drafter the fixture's inputs and gets
    the reference's outputs back (flex only without gradients on the CPU)."""
    c = golden.case("train")
    ids = c["input_ids"]
    b, s = ids.shape
    batch = Batch(ids, torch.ones(b, s, dtype=torch.bool), torch.ones_like(ids),
                  torch.full((b,), s))
    embed = torch.nn.Embedding.from_pretrained(golden.tensors()["target.embed_tokens.weight"])
    head = torch.nn.Linear(64, 512, bias=False)
    anchors = Anchors(c["anchor_positions"], c["block_keep_mask"])
    drafter = Recorder().eval()
    with torch.no_grad():
        block_loss(drafter, embed, head, c["target_hidden"], batch, anchors, MASK_ID,
                   position_weights(BLOCK, 7.0), attention)
    ((kw, out),) = drafter.calls
    assert torch.equal(kw["position_ids"], c["position_ids"])
    assert torch.equal(kw["noise_embedding"], c["noise_embedding"])
    assert torch.equal(kw["target_hidden"], c["target_hidden"])
    if attention == "sdpa":
        assert torch.equal(kw["attention_mask"], c["attention_mask"])
    assert max_diff(out, c["output"]) <= ATOL
