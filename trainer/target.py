"""The frozen target: loading it, its features for the drafter, and its KV cache.

Layer i of the target is `hidden_states[i + 1]` (index 0 is the embedding output); vLLM
shipped an off-by-one at exactly this point. The target runs under inference mode and its
features are cloned out of it, so that autograd may save them for the drafter's backward.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from trainer.contract import MASK_TOKEN, TargetFacts
from trainer.drafter import build_target_layer_ids


class TargetError(ValueError):
    pass


def load_target(path: str, dtype: torch.dtype, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise TargetError(f"target {path}: cannot load: {exc}") from None
    model.to(device).eval()
    model.requires_grad_(False)
    return model


def num_layers(target: Any) -> int:
    return int(target.config.num_hidden_layers)


def layer_ids(target: Any, configured: list[int] | None, count: int) -> list[int]:
    """The configured ids, checked against the target's depth, or evenly spaced ones;
    sorted, because SGLang concatenates the features in layer order."""
    n = num_layers(target)
    if configured is None:
        try:
            return build_target_layer_ids(n, count)
        except ValueError as exc:
            raise TargetError(f"[train] target_features: {exc}") from None
    # SGLang captures layer i as the input of layer i + 1: the last layer has none.
    bad = [i for i in configured if not 0 <= i <= n - 2]
    if bad:
        raise TargetError(f"[train] target_layer_ids: {bad} not in 0..{n - 2} (the target "
                          f"has {n} layers; SGLang cannot capture the last one)")
    if len(set(configured)) != len(configured):
        raise TargetError(f"[train] target_layer_ids: {configured} repeats a layer")
    return sorted(configured)


def embeddings(target: Any) -> nn.Module:
    return target.get_input_embeddings()


def lm_head(target: Any) -> nn.Module:
    return target.get_output_embeddings()


def select_features(hidden_states: tuple[torch.Tensor, ...], ids: list[int]) -> torch.Tensor:
    """Concatenate the hidden states of target layers `ids` ([b, S, len(ids) * H])."""
    return torch.cat([hidden_states[i + 1] for i in ids], dim=-1)


def features(target: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             ids: list[int]) -> torch.Tensor:
    """The target's features for a batch; nothing is kept but the selected layers."""
    with torch.inference_mode():
        # The base model only: the LM head's logits over the vocabulary are not needed.
        out = target.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                output_hidden_states=True, use_cache=False)
        feats = select_features(out.hidden_states, ids)
    return feats.clone()


def cache_kwarg(target: Any) -> str:
    """transformers renamed `past_key_values` to `cache` (5.x); use whichever this has."""
    params = inspect.signature(target.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(target: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=target.config)


def crop(cache: Any, length: int) -> None:
    """Keep the first `length` positions (a negative crop: the form both 4.x and 5.x take)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def choose_mask_token(configured: int | None, tokenizer: Any, embedding_rows: int) -> int:
    """The block's mask token: `[train] mask_token_id`, else the tokenizer's `<|MASK|>`, else
    its own mask token, else the first embedding row past the tokenizer's vocabulary (for
    Qwen3 that is 151669, the id z-lab's drafts use, where SGLang and SpecForge add
    `<|MASK|>`). SGLang refuses a config whose id differs from the tokenizer's `<|MASK|>`."""
    mapped = tokenizer.get_vocab().get(MASK_TOKEN)
    if configured is not None:
        if not 0 <= configured < embedding_rows:
            raise TargetError(f"[train] mask_token_id: {configured} is outside the target's "
                              f"{embedding_rows} embedding rows")
        if mapped is not None and mapped != configured:
            raise TargetError(f"[train] mask_token_id: {configured}, but the tokenizer maps "
                              f"{MASK_TOKEN} to {mapped}; SGLang refuses that, use {mapped}")
        return configured
    if mapped is not None:
        return int(mapped)
    own = getattr(tokenizer, "mask_token_id", None)
    if own is not None:
        return int(own)
    n = len(tokenizer)
    if n < embedding_rows:
        return n
    raise TargetError("[train] mask_token_id: the tokenizer has no mask token and the target "
                      "no spare embedding row; set one")


def target_facts(path: str) -> TargetFacts:
    """The target's depth, width and vocabulary from its config alone (no weights)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise TargetError(f"target {path}: cannot read its config: {exc}") from None
    return TargetFacts.of(config)
