"""The drafter as built: target layer indexing, KV injection, what a block may see, and
that checkpoints carry neither the target's embeddings nor its head."""

from __future__ import annotations

import torch

from tests.trainer.tinyworld import World
from trainer.blocks import block_mask, position_ids
from trainer.contract import DFlashSettings, drafter_config
from trainer.drafter import DFlashDraftModel, DraftCache, build_target_layer_ids
from trainer.target import features, layer_ids


def test_layer_ids_spaced_from_one_to_l_minus_three() -> None:
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-4B/8B
    assert build_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]  # Qwen3.5-4B
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # Qwen3.6-27B
    assert build_target_layer_ids(8, 5) == [1, 2, 3, 4, 5]
    assert build_target_layer_ids(12, 3) == [1, 5, 9]


def test_layer_i_is_the_output_of_decoder_layer_i(random_world: World) -> None:
    """hidden_states[i + 1], not [i] (vLLM #42704): compare with hooks on the layers."""
    target = random_world.model
    assert target.config.num_hidden_layers >= 8
    ids = layer_ids(target, None, 5)
    assert ids == [1, 2, 3, 4, 5]
    seen: dict[int, torch.Tensor] = {}
    hooks = [layer.register_forward_hook(
        lambda _m, _a, out, i=i: seen.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i, layer in enumerate(target.model.layers)]
    try:
        x = torch.randint(0, 300, (2, 12))
        feats = features(target, x, torch.ones_like(x), ids)
    finally:
        for h in hooks:
            h.remove()
    h = target.config.hidden_size
    assert feats.shape == (2, 12, 5 * h) and not feats.is_inference()
    for n, i in enumerate(ids):
        assert torch.equal(feats[..., n * h:(n + 1) * h], seen[i])
        assert not torch.allclose(feats[..., n * h:(n + 1) * h], seen[i - 1])


def _drafter(world: World, layers: int = 2) -> DFlashDraftModel:
    torch.manual_seed(0)
    settings = DFlashSettings(4, len(world.tokenizer), [1, 3, 5])
    return DFlashDraftModel(drafter_config(world.model.config, layers, settings)).eval()


def _run(drafter: DFlashDraftModel, noise: torch.Tensor, feats: torch.Tensor,
         anchors: torch.Tensor) -> torch.Tensor:
    s = feats.shape[1]
    return drafter(position_ids=position_ids(anchors, s, 4),
                   attention_mask=block_mask(anchors, None, s, 4), noise_embedding=noise,
                   target_hidden=feats)


def test_a_block_sees_context_before_its_anchor_and_itself_only(random_world: World) -> None:
    drafter = _drafter(random_world)
    h = random_world.model.config.hidden_size
    torch.manual_seed(1)
    feats = torch.randn(1, 12, 3 * h)
    noise = torch.randn(1, 8, h)
    anchors = torch.tensor([[4, 8]])
    with torch.no_grad():
        base = _run(drafter, noise, feats, anchors)
        # Context at or after block 0's anchor (its own position included) is invisible.
        later = feats.clone()
        later[:, 4:] += 5.0
        assert torch.allclose(_run(drafter, noise, later, anchors)[:, :4], base[:, :4])
        assert not torch.allclose(_run(drafter, noise, later, anchors)[:, 4:], base[:, 4:])
        # Context before it is seen.
        earlier = feats.clone()
        earlier[:, 3] += 5.0
        assert not torch.allclose(_run(drafter, noise, earlier, anchors)[:, :4], base[:, :4])
        # Another block is invisible; a later token of the same block is seen (both ways).
        other = noise.clone()
        other[:, 4:] += 5.0
        assert torch.allclose(_run(drafter, other, feats, anchors)[:, :4], base[:, :4])
        own = noise.clone()
        own[:, 3] += 5.0
        assert not torch.allclose(_run(drafter, own, feats, anchors)[:, 0], base[:, 0])


def test_zero_context_changes_the_draft(random_world: World) -> None:
    """The context enters as keys and values: without it the output differs."""
    drafter = _drafter(random_world, layers=1)
    h = random_world.model.config.hidden_size
    feats = torch.randn(1, 10, 3 * h)
    noise = torch.randn(1, 4, h)
    anchors = torch.tensor([[6]])
    with torch.no_grad():
        a = _run(drafter, noise, feats, anchors)
        b = _run(drafter, noise, torch.zeros_like(feats), anchors)
    assert not torch.allclose(a, b)


def test_cached_context_equals_the_whole_context(random_world: World) -> None:
    """Inference feeds the context in pieces through DraftCache: same result as at once."""
    drafter = _drafter(random_world)
    h = random_world.model.config.hidden_size
    feats = torch.randn(1, 9, 3 * h)
    noise = torch.randn(1, 4, h)
    with torch.no_grad():
        whole = drafter(position_ids=torch.arange(13)[None], noise_embedding=noise,
                        target_hidden=feats)
        cache = DraftCache()
        drafter(position_ids=torch.arange(9)[None], noise_embedding=noise,
                target_hidden=feats[:, :5], past_key_values=cache, use_cache=True)
        assert cache.get_seq_length() == 9
        cache.crop(5)  # the context stays, the block goes (z-lab's crop to `start`)
        pieces = drafter(position_ids=torch.arange(5, 13)[None], noise_embedding=noise,
                         target_hidden=feats[:, 5:], past_key_values=cache, use_cache=True)
    assert torch.allclose(whole, pieces, atol=1e-5)


def test_weights_are_qwen3_layers_fc_and_norms_only(random_world: World) -> None:
    drafter = _drafter(random_world)
    names = set(drafter.state_dict())
    assert "fc.weight" in names and "hidden_norm.weight" in names and "norm.weight" in names
    assert "layers.0.self_attn.q_proj.weight" in names and "layers.1.mlp.gate_proj.weight" in names
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert drafter.fc.weight.shape == (random_world.model.config.hidden_size,
                                       3 * random_world.model.config.hidden_size)
    assert drafter.fc.bias is None
