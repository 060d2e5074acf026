"""Parity with the reference DFlashDraftModel (z-lab/dflash) on the golden fixture.

The fixture's outputs come from the reference module (and SpecForge's, identical); its masks
from SpecForge's `create_dflash_sdpa_mask`. Our drafter takes the reference's weights under
their own names and must reproduce every case to 1e-5 in float32, and the training inputs
our code builds (block tokens, positions, mask, feature order) must equal the fixture's
exactly. A change of one architectural detail (k_norm, hidden_norm, feature order, position
ids, the mask) fails here even when training and evaluation still agree with each other.
"""

from __future__ import annotations

import torch

from tests.trainer import golden
from tests.trainer.golden import ATOL, max_diff
from trainer.blocks import block_mask, block_tokens, flex_block_mask, position_ids
from trainer.drafter import DraftCache
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
