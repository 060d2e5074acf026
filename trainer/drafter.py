"""The DFlash drafter: a few Qwen3 decoder layers conditioned on the target's hidden states.

This file is also every checkpoint's modeling code: it is copied verbatim as `dflash.py` next
to `config.json`, whose `auto_map` points at `DFlashDraftModel`, so that
`AutoModel.from_pretrained(dir, trust_remote_code=True)` builds it. It therefore imports only
torch and transformers (4.57 and 5.x) and nothing of fleetdeck.

The method (z-lab/dflash `DFlashDraftModel`, whose state_dict names these are): the hidden
states of several target layers are concatenated, projected by a bias-free `fc` and
normalised once (`hidden_norm`). In every layer the queries come from the block only, and the
keys and values from the same `k_proj`/`v_proj` (and per-head `k_norm`) applied to
[projected context ; layer-normed block]; RoPE takes the last q_len positions for the queries
and all positions for the keys. Attention is non-causal; the final `norm` is applied. A block
is `[anchor, MASK x (B-1)]`, embedded with the target's embeddings; after the target's LM
head, block position k predicts the token at position k (no shift).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)

Rope = tuple[torch.Tensor, torch.Tensor]


def build_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """`count` target layers spaced evenly from 1 to L-3 (z-lab's build_target_layer_ids).

    36 layers, 5 features: [1, 9, 17, 25, 33]. Layer i is `hidden_states[i + 1]`.
    """
    if count == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end <= start:
        raise ValueError(f"a target of {num_target_layers} layers is too shallow for DFlash")
    span = end - start
    ids = [round(start + i * span / (count - 1)) for i in range(count)]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{count} distinct layers do not fit in 1..{end}")
    return ids


class DraftCache:
    """Keys and values per layer, with the `update` and `crop` of transformers' DynamicCache
    (either one can be passed as `past_key_values`).

    Each call appends [context ; block]; the caller then crops the block away again, as
    z-lab's dflash_generate does, so only context stays across speculative rounds.
    """

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx < len(self.keys):
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], key_states], dim=-2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], value_states], dim=-2)
        else:
            self.keys.append(key_states)
            self.values.append(value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.keys[layer_idx].shape[-2]) if layer_idx < len(self.keys) else 0

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions (negative: drop that many, as 5.x wants)."""
        if max_length < 0:
            max_length = self.get_seq_length() + max_length
        self.keys = [k[..., :max_length, :] for k in self.keys]
        self.values = [v[..., :max_length, :] for v in self.values]


_compiled_flex: Any = None


def _flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any,
                    scale: float) -> torch.Tensor:
    """flex_attention with a BlockMask: compiled on CUDA (fused, never materialises the
    scores); eager elsewhere, which torch 2.13 runs forward-only on the CPU."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    fn: Any = flex_attention
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)
        fn = _compiled_flex
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        out: torch.Tensor = fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)
    return out


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys and values also cover the injected context."""

    def __init__(self, config: Qwen3Config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = int(getattr(config, "head_dim", None)
                            or config.hidden_size // config.num_attention_heads)
        self.scaling = self.head_dim ** -0.5
        heads = int(config.num_attention_heads)
        kv_heads = int(config.num_key_value_heads or heads)
        bias = bool(config.attention_bias)
        self.q_proj = nn.Linear(config.hidden_size, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, target_hidden: torch.Tensor, rope: Rope,
                attention_mask: Any = None, past_key_values: Any = None) -> torch.Tensor:
        b, q_len, _ = hidden_states.shape
        d = self.head_dim
        q = self.q_norm(self.q_proj(hidden_states).view(b, q_len, -1, d)).transpose(1, 2)
        # One projection for context and block: the context is hidden_norm's output, not
        # layer-normed again; k_norm acts per head on both.
        n = target_hidden.shape[1] + q_len
        k = torch.cat([self.k_proj(target_hidden), self.k_proj(hidden_states)], dim=1)
        v = torch.cat([self.v_proj(target_hidden), self.v_proj(hidden_states)], dim=1)
        k = self.k_norm(k.view(b, n, -1, d)).transpose(1, 2)
        v = v.view(b, n, -1, d).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in rope)
        # The queries are the last q_len positions; the keys are all of them.
        q = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
        k = k * cos + rotate_half(k) * sin
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
            out = _flex_attention(q, k, v, attention_mask, self.scaling)
        else:
            # Non-causal: without a mask a block sees every key it is given, both ways.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask,
                                                 scale=self.scaling, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size,
                                                     eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, target_hidden: torch.Tensor, rope: Rope,
                attention_mask: Any = None, past_key_values: Any = None) -> torch.Tensor:
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), target_hidden,
                                           rope, attention_mask, past_key_values)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class DFlashDraftModel(Qwen3PreTrainedModel):
    """The drafter; `forward` takes z-lab's keyword arguments.

    config: a Qwen3 config with `dflash_config` {target_layer_ids, mask_token_id} and
    `block_size`. The target's embeddings and LM head are not part of it.
    """

    config_class = Qwen3Config
    _no_split_modules = ["DFlashDecoderLayer"]  # noqa: RUF012 (transformers' own attribute)

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config)
        dflash = config.dflash_config
        self.target_layer_ids = [int(i) for i in dflash["target_layer_ids"]]
        self.mask_token_id = int(dflash["mask_token_id"])
        self.block_size = int(config.block_size)
        hidden = config.hidden_size
        self.layers = nn.ModuleList(
            [DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.post_init()

    def forward(self, position_ids: torch.Tensor, attention_mask: Any = None,
                noise_embedding: torch.Tensor | None = None,
                target_hidden: torch.Tensor | None = None, past_key_values: Any = None,
                use_cache: bool = False, **kwargs: Any) -> torch.Tensor:
        """Hidden states of the block tokens, after the final norm (before the LM head).

        position_ids [b, C+Q]: the context's then the block's absolute positions (with a
        cache, only the new context's); noise_embedding [b, Q, H]: the embedded block;
        target_hidden [b, C, K*H]: the concatenated target features of the (new) context;
        attention_mask: None, a bool [b, 1, Q, C+Q] (True = may attend) or a flex BlockMask;
        past_key_values: a DraftCache or transformers DynamicCache, used whenever given
        (`use_cache` and other keywords are accepted for z-lab's calls).
        """
        if noise_embedding is None or target_hidden is None:
            raise ValueError("DFlashDraftModel needs noise_embedding and target_hidden")
        context = self.hidden_norm(self.fc(target_hidden))
        rope = self.rotary_emb(noise_embedding, position_ids)
        h = noise_embedding
        for layer in self.layers:
            h = layer(h, context, rope, attention_mask, past_key_values)
        out: torch.Tensor = self.norm(h)
        return out
