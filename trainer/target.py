"""The frozen target: loading it, its features for the drafter, and its KV cache.

Layer i of the target is `hidden_states[i + 1]` (index 0 is the embedding output), the
output of decoder layer i; vLLM shipped an off-by-one at exactly this point. The target runs
under inference mode and its features are cloned out of it, so that autograd may save them
for the drafter's backward.

For training the target is lean: only its decoder layers up to the deepest feature layer are
built and loaded, straight onto the device (no full copy in host memory), and only the
feature layers' outputs are kept (forward hooks), not every layer's hidden states.
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


def target_config(path: str) -> Any:
    """The target's config.json, as transformers reads it (no weights)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise TargetError(f"target {path}: cannot read its config: {exc}") from None


def load_target(path: str, dtype: torch.dtype, device: torch.device,
                keep_layers: int | None = None) -> Any:
    """The frozen target in `dtype`, its weights loaded straight onto `device` (safetensors
    are read tensor by tensor: no full copy in host memory). `keep_layers`: build and load
    only the first N decoder layers (training needs none past the deepest feature layer);
    the model's config then says N layers, `target_config` the target's own depth."""
    import transformers
    from transformers import AutoModelForCausalLM

    config = target_config(path)
    text = config.get_text_config()
    if keep_layers is not None and keep_layers < int(text.num_hidden_layers):
        text.num_hidden_layers = keep_layers
        if getattr(text, "layer_types", None):
            text.layer_types = text.layer_types[:keep_layers]
    # The layers left out are in the checkpoint: their weights are skipped, not an error.
    quiet = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    # On a GPU each tensor goes from the file to the device (accelerate's device_map); on
    # the CPU the device is host memory, loaded tensor by tensor all the same.
    placed: dict[str, Any] = {} if device.type == "cpu" else {"device_map": {"": device}}
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype,
                                                          **placed)
    except (OSError, ValueError) as exc:
        raise TargetError(f"target {path}: cannot load: {exc}") from None
    finally:
        transformers.logging.set_verbosity(quiet)
    model.eval()
    model.requires_grad_(False)
    return model


def num_layers(target: Any) -> int:
    """The depth of a target (a model or its config)."""
    config = getattr(target, "config", target)
    return int(config.get_text_config().num_hidden_layers)


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


def decoder_layers(target: Any) -> nn.ModuleList:
    layers: nn.ModuleList = target.base_model.layers
    return layers


def features(target: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             ids: list[int]) -> torch.Tensor:
    """The target's features for a batch ([b, S, len(ids) * H]): the outputs of decoder
    layers `ids`, copied by forward hooks into one tensor as the layers run; no other
    layer's hidden states are kept. Under no_grad, not inference mode: the result is an
    ordinary tensor that autograd may save for the drafter's backward, without a copy."""
    layers = decoder_layers(target)
    if max(ids) >= len(layers):
        raise TargetError(f"target layer {max(ids)}: the target was loaded with "
                          f"{len(layers)} layers")
    width = int(target.get_input_embeddings().weight.shape[1])
    out = torch.empty(*input_ids.shape, len(ids) * width, device=input_ids.device,
                      dtype=target.get_input_embeddings().weight.dtype)

    def keeper(slot: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            h = output[0] if isinstance(output, tuple) else output
            out[..., slot * width: (slot + 1) * width].copy_(h)
        return hook

    handles = [layers[i].register_forward_hook(keeper(slot)) for slot, i in enumerate(ids)]
    try:
        with torch.no_grad():
            # The base model only: the LM head's logits over the vocabulary are not needed.
            target.base_model(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return out


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
    return TargetFacts.of(target_config(path))
