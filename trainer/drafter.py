"""The DFlash drafter: a few Qwen3 decoder layers conditioned on the target's hidden states.

Per reference/dflash.md. Hidden states of several target layers are concatenated, projected
by a bias-free linear layer (`fc`) and normalised (`hidden_norm`); that context enters every
drafter layer as extra keys and values (the layer's own k/v projections, k_norm and RoPE at
absolute positions). Queries come from the block only: `[anchor, MASK x (B-1)]`, embedded
with the target's embeddings; the output at block position k, after the final norm and the
target's LM head, predicts the token at position k (no shift). The layers are transformers'
own `Qwen3DecoderLayer` (attention, MLP and norms, with its parameter names), so checkpoints
have the z-lab DFlash layout: `layers.N.*`, `fc`, `hidden_norm`, `norm`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3DecoderLayer,
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


@dataclass(frozen=True)
class DFlashSettings:
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int] = field(default_factory=list)


def drafter_config(target: Qwen3Config, layers: int, settings: DFlashSettings) -> Qwen3Config:
    """The target's config at the target's width with the drafter's depth and DFlash keys."""
    cfg = copy.deepcopy(target)
    cfg.num_hidden_layers = layers
    cfg.layer_types = ["full_attention"] * layers
    cfg.use_cache = False
    cfg.architectures = ["DFlashDraftModel"]
    cfg.block_size = settings.block_size
    cfg.dflash_config = {
        "block_size": settings.block_size,
        "mask_token_id": settings.mask_token_id,
        "target_layer_ids": list(settings.target_layer_ids),
    }
    return cfg


def settings_of(cfg: Qwen3Config) -> DFlashSettings:
    d = cfg.dflash_config
    return DFlashSettings(int(d["block_size"]), int(d["mask_token_id"]),
                          [int(i) for i in d["target_layer_ids"]])


def _rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    cos, sin = (t.unsqueeze(1) for t in rope)
    return x * cos + rotate_half(x) * sin


class DraftCache:
    """Keys and values of the context, per layer, kept across speculative rounds.

    Only context goes in: block keys are recomputed every round, which is what z-lab's
    crop of the draft cache back to `start` amounts to.
    """

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor,
                                                                           torch.Tensor]:
        if layer in self.keys:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class DFlashLayer(Qwen3DecoderLayer):
    """Qwen3's decoder layer, its attention reading the context as extra keys and values."""

    def __init__(self, config: Qwen3Config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.layer_index = layer_idx

    def forward(
        self, hidden_states: torch.Tensor, context: torch.Tensor, rope_q: Rope,
        rope_ctx: Rope, attention_mask: torch.Tensor | None = None,
        cache: DraftCache | None = None,
    ) -> torch.Tensor:
        residual = hidden_states
        x = self.input_layernorm(hidden_states)
        hidden_states = residual + self._attend(x, context, rope_q, rope_ctx, attention_mask,
                                                cache)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))

    def _attend(self, x: torch.Tensor, context: torch.Tensor, rope_q: Rope, rope_ctx: Rope,
                attention_mask: torch.Tensor | None, cache: DraftCache | None) -> torch.Tensor:
        attn = self.self_attn
        b, n, _ = x.shape
        c = context.shape[1]
        d = attn.head_dim
        q = _rope(attn.q_norm(attn.q_proj(x).view(b, n, -1, d)).transpose(1, 2), rope_q)
        k = _rope(attn.k_norm(attn.k_proj(x).view(b, n, -1, d)).transpose(1, 2), rope_q)
        v = attn.v_proj(x).view(b, n, -1, d).transpose(1, 2)
        # The same projections for context and block (the context is not layer-normed
        # again: hidden_norm already did), RoPE at the context's own positions.
        kc = _rope(attn.k_norm(attn.k_proj(context).view(b, c, -1, d)).transpose(1, 2),
                   rope_ctx)
        vc = attn.v_proj(context).view(b, c, -1, d).transpose(1, 2)
        if cache is not None:
            kc, vc = cache.extend(self.layer_index, kc, vc)
        keys = torch.cat([kc, k], dim=2)
        values = torch.cat([vc, v], dim=2)
        # Non-causal: with no mask a block sees all the context it is given and all of
        # itself, which is what inference needs; training passes the block mask.
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attention_mask,
                                             scale=attn.scaling, enable_gqa=True)
        return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DFlashDrafter(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = config
        self.settings = settings_of(config)
        hidden = config.hidden_size
        n_features = len(self.settings.target_layer_ids)
        self.layers = nn.ModuleList(
            [DFlashLayer(config, i) for i in range(config.num_hidden_layers)])
        self.fc = nn.Linear(n_features * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        std = config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, noise_embedding: torch.Tensor, target_hidden: torch.Tensor,
                positions: torch.Tensor, ctx_positions: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                cache: DraftCache | None = None) -> torch.Tensor:
        """Hidden states of the block tokens (before the LM head).

        noise_embedding [b, Q, H]: embedded block tokens; target_hidden [b, C, n*H]: the
        concatenated target features of the context (only the new ones with a cache);
        positions [b, Q] and ctx_positions [b, C]: absolute positions; attention_mask
        [b, 1, Q, C+Q] bool (True = may attend) or None.
        """
        context = self.hidden_norm(self.fc(target_hidden))
        rope_q = self.rotary_emb(noise_embedding, positions)
        rope_ctx = self.rotary_emb(context, ctx_positions)
        h = noise_embedding
        for layer in self.layers:
            h = layer(h, context, rope_q, rope_ctx, attention_mask, cache)
        return self.norm(h)
