"""The lean target: only the layers up to the deepest feature layer are built, loaded and
run, and only the feature layers' outputs are kept; its features are the full target's."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from tests.trainer.tinyworld import World
from trainer.target import (
    decoder_layers,
    features,
    layer_ids,
    load_target,
    num_layers,
    select_features,
    target_config,
)


def _batch(world: World) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    rows = len(world.tokenizer)
    ids = torch.randint(0, rows, (3, 40), generator=gen)
    attn = torch.ones_like(ids)
    attn[1, 31:] = 0  # right padding, as collate pads
    attn[2, 17:] = 0
    return ids, attn


def test_lean_features_equal_the_full_targets_hidden_states(random_world: World) -> None:
    path = str(random_world.target)
    config = target_config(path)
    ids = layer_ids(config, None, 3)
    assert num_layers(config) == 8 and ids == [1, 3, 5]
    lean = load_target(path, torch.float32, torch.device("cpu"), keep_layers=max(ids) + 1)
    assert len(decoder_layers(lean)) == max(ids) + 1
    full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert len(decoder_layers(full)) == 8
    lean_params = sum(p.numel() for p in lean.parameters())
    full_params = sum(p.numel() for p in full.parameters())
    layer = sum(p.numel() for p in decoder_layers(full)[0].parameters())
    assert full_params - lean_params == 2 * layer  # layers 6 and 7 are never loaded
    assert all(p.device.type == "cpu" and not p.requires_grad for p in lean.parameters())
    input_ids, attn = _batch(random_world)
    with torch.inference_mode():
        out = full.base_model(input_ids=input_ids, attention_mask=attn,
                              output_hidden_states=True, use_cache=False)
        want = select_features(out.hidden_states, ids)
    got = features(lean, input_ids, attn, ids)
    assert got.shape == (3, 40, 3 * 64)
    assert torch.equal(got, want)
    # The same from the full target (evaluation loads it whole), and its hooks are gone.
    hooks = [len(layer._forward_hooks) for layer in decoder_layers(full)]
    assert torch.equal(features(full, input_ids, attn, ids), want)
    assert [len(layer._forward_hooks) for layer in decoder_layers(full)] == hooks
    # Not inference tensors: autograd may save them for the drafter's backward.
    assert not got.is_inference()


def test_the_lean_target_is_loaded_in_bf16_when_asked(random_world: World) -> None:
    lean = load_target(str(random_world.target), torch.bfloat16, torch.device("cpu"),
                       keep_layers=2)
    assert {p.dtype for p in lean.parameters()} == {torch.bfloat16}
    assert len(decoder_layers(lean)) == 2
