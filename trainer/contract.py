"""What a drafter checkpoint carries for its readers, how it is written and how it is checked.

The readers are SGLang 0.5.23's DFLASH worker, z-lab's `DFlashDraftModel` (through `auto_map`,
transformers 4.57 and 5.x) and SpecForge (tests/fixtures/dflash/sglang-loader-contract.md).
A checkpoint is `config.json`, `model.safetensors` under the reference's state_dict names, and
`dflash.py` (trainer/drafter.py, copied verbatim). The config holds, consistently:
`architectures` ["DFlashDraftModel"] (SGLang picks the class by it), `model_type` qwen3,
`auto_map`, `num_target_layers` (z-lab and SpecForge raise without it), `block_size` (top
level and in `dflash_config`, equal: SGLang reads the latter first), sorted
`dflash_config.target_layer_ids` below the target's last layer (SGLang concatenates in layer
order and cannot capture the last one), `dflash_config.mask_token_id` inside the vocab,
`rope_parameters` and a top-level `rope_theta` (4.57 reads only the latter and silently
falls back to 1e4), and `dtype`/`torch_dtype` equal to the weights' (SGLang runs a float32
or dtype-less config as float16).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from safetensors import SafetensorError, safe_open
from transformers import Qwen3Config

from trainer import drafter as drafter_module

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
MODELING = "dflash.py"
AUTO_MAP = {"AutoModel": "dflash.DFlashDraftModel"}
ARCHITECTURE = "DFlashDraftModel"
# The token SGLang, z-lab and SpecForge look up (or add) when a config has no mask id.
MASK_TOKEN = "<|MASK|>"
# SGLang's extensions of DFlash (Nemotron, Domino, conv, selector, ...): present, they change
# the model it builds, so a plain drafter must not carry them.
EXTENSION_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k",
                  "output_multiplier", "final_logit_softcapping", "attention_sink_bias",
                  "attention_value_scale", "projector_type", "use_gemma_norm",
                  "has_embed_tokens", "quantization_config", "is_causal")
# safetensors' names for the dtypes a config may state.
SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class ContractError(ValueError):
    """A checkpoint that its readers would refuse or misread; the message lists why."""


@dataclass(frozen=True)
class DFlashSettings:
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]


@dataclass(frozen=True)
class TargetFacts:
    """What a drafter must agree with about its target."""

    num_layers: int
    hidden_size: int
    # Rows of the target's embedding table (its config's vocab_size).
    vocab_rows: int

    @classmethod
    def of(cls, config: Any) -> TargetFacts:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return cls(int(text.num_hidden_layers), int(text.hidden_size), int(text.vocab_size))


def modeling_source() -> Path:
    """The modeling file written into every checkpoint as dflash.py."""
    return Path(drafter_module.__file__)


def _rope_parameters(target: Any) -> dict[str, Any]:
    rope = getattr(target, "rope_parameters", None)
    if isinstance(rope, dict) and "rope_theta" in rope:
        return dict(rope)
    # A 4.x-style config: rope_theta (and rope_scaling) at the top level.
    out: dict[str, Any] = dict(getattr(target, "rope_scaling", None) or {})
    out.setdefault("rope_type", out.pop("type", "default"))
    out["rope_theta"] = getattr(target, "rope_theta", 10000.0)
    return out


def drafter_config(target: Any, layers: int, settings: DFlashSettings) -> Qwen3Config:
    """A Qwen3 config at the target's width with the drafter's depth and the DFlash keys.

    Built field by field, not copied: a target's quantization, sliding windows or
    architecture must not reach the drafter.
    """
    t = target.get_text_config() if hasattr(target, "get_text_config") else target
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    cfg = Qwen3Config(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=getattr(t, "num_key_value_heads", None) or t.num_attention_heads,
        head_dim=head_dim, hidden_act=getattr(t, "hidden_act", "silu"),
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
        attention_bias=bool(getattr(t, "attention_bias", False)),
        initializer_range=getattr(t, "initializer_range", 0.02),
        rope_parameters=_rope_parameters(t), tie_word_embeddings=False,
        use_sliding_window=False, layer_types=["full_attention"] * layers,
        bos_token_id=getattr(t, "bos_token_id", None),
        eos_token_id=getattr(t, "eos_token_id", None),
        pad_token_id=getattr(t, "pad_token_id", None))
    cfg.architectures = [ARCHITECTURE]
    cfg.auto_map = dict(AUTO_MAP)
    cfg.num_target_layers = int(t.num_hidden_layers)
    cfg.block_size = settings.block_size
    cfg.dflash_config = {
        "block_size": settings.block_size,
        "mask_token_id": settings.mask_token_id,
        "target_layer_ids": sorted(settings.target_layer_ids),
    }
    return cfg


def settings_of(config: Any) -> DFlashSettings:
    d = config.dflash_config
    return DFlashSettings(int(config.block_size), int(d["mask_token_id"]),
                          [int(i) for i in d["target_layer_ids"]])


def config_dict(config: Qwen3Config, dtype: str) -> dict[str, Any]:
    """config.json for a drafter whose weights are saved in `dtype`."""
    d: dict[str, Any] = json.loads(config.to_json_string())
    for key in ("_name_or_path", "torch_dtype", "dtype", *EXTENSION_KEYS):
        d.pop(key, None)
    rope = _rope_parameters(config)
    d["architectures"] = [ARCHITECTURE]
    d["auto_map"] = dict(AUTO_MAP)
    d["model_type"] = "qwen3"
    d["rope_parameters"] = rope
    d["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        # 4.57 reads scaling from rope_scaling, not rope_parameters.
        d["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    d["block_size"] = int(config.block_size)
    d["dflash_config"] = {**config.dflash_config, "block_size": int(config.block_size),
                          "target_layer_ids": sorted(config.dflash_config["target_layer_ids"])}
    d["dtype"] = d["torch_dtype"] = dtype
    d["tie_word_embeddings"] = False
    d["draft_vocab_size"] = d["vocab_size"]
    d["use_cache"] = True
    return dict(sorted(d.items()))


def expected_weights(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The reference's state_dict names and shapes for a config."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    d = int(config.get("head_dim") or h // heads)
    inter = int(config["intermediate_size"])
    k = len(config["dflash_config"]["target_layer_ids"])
    out: dict[str, tuple[int, ...]] = {"fc.weight": (h, k * h), "hidden_norm.weight": (h,),
                                       "norm.weight": (h,)}
    projections = {"q_proj": (heads * d, h), "k_proj": (kv * d, h), "v_proj": (kv * d, h),
                   "o_proj": (h, heads * d)}
    for i in range(int(config["num_hidden_layers"])):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        for name, shape in projections.items():
            out[f"{p}self_attn.{name}.weight"] = shape
            if config.get("attention_bias"):
                out[f"{p}self_attn.{name}.bias"] = (shape[0],)
        out[p + "self_attn.q_norm.weight"] = (d,)
        out[p + "self_attn.k_norm.weight"] = (d,)
        out[p + "mlp.gate_proj.weight"] = (inter, h)
        out[p + "mlp.up_proj.weight"] = (inter, h)
        out[p + "mlp.down_proj.weight"] = (h, inter)
    return out


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise ContractError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise ContractError(f"{path}: unreadable: {exc}") from None
    if not isinstance(value, dict):
        raise ContractError(f"{path}: not a JSON object")
    return value


def weight_meta(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype), from the file's header only."""
    path = folder / WEIGHTS
    if not path.exists():
        raise ContractError(f"{path}: missing")
    try:
        with safe_open(str(path), "pt") as f:
            return {k: (tuple(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype()))
                    for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    except (OSError, SafetensorError, ValueError) as exc:
        raise ContractError(f"{path}: unreadable: {exc}") from None


def load_config(folder: Path) -> Qwen3Config:
    """A checkpoint's config as the drafter takes it (after `check` passed)."""
    d = read_config(folder)
    d.pop("torch_dtype", None)  # 5.x warns about it; `dtype` says the same
    return Qwen3Config.from_dict(d)


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _core_problems(c: dict[str, Any], target: TargetFacts | None) -> list[str]:
    """What our own code and every reader need; an older checkpoint passes these."""
    out: list[str] = []
    for key in ("hidden_size", "num_attention_heads", "intermediate_size",
                "num_hidden_layers", "vocab_size"):
        if not _int(c.get(key)) or c[key] <= 0:
            out.append(f"{key}: must be a positive integer, got {c.get(key)!r}")
    dflash = c.get("dflash_config")
    if not isinstance(dflash, dict):
        return [*out, "dflash_config: missing (not a DFlash drafter)"]
    block = c.get("block_size")
    if not _int(block) or block < 2:
        out.append(f"block_size: must be an integer of at least 2, got {block!r}")
    elif "block_size" in dflash and dflash["block_size"] != block:
        out.append(f"dflash_config.block_size {dflash['block_size']!r} differs from block_size "
                   f"{block}: SGLang would draft blocks of the first, the others of the second")
    ids = dflash.get("target_layer_ids")
    depth = target.num_layers if target else c.get("num_target_layers")
    if not isinstance(ids, list) or not ids or not all(_int(i) for i in ids):
        out.append(f"dflash_config.target_layer_ids: must be a list of layer numbers, "
                   f"got {ids!r}")
    else:
        if ids != sorted(set(ids)):
            out.append(f"dflash_config.target_layer_ids: {ids} must be increasing (SGLang "
                       "concatenates the features in layer order)")
        if _int(depth) and not all(0 <= i <= depth - 2 for i in ids):
            out.append(f"dflash_config.target_layer_ids: {ids} must lie in 0..{depth - 2} "
                       f"for a target of {depth} layers (the last one has no capture point)")
    mask = dflash.get("mask_token_id")
    rows = [v for v in (c.get("vocab_size"), target.vocab_rows if target else None) if _int(v)]
    if not _int(mask) or mask < 0:
        out.append(f"dflash_config.mask_token_id: must be a token id, got {mask!r}")
    elif rows and mask >= min(rows):
        out.append(f"dflash_config.mask_token_id: {mask} is outside the vocab of {min(rows)} "
                   "rows")
    if target is not None:
        if c.get("hidden_size") != target.hidden_size:
            out.append(f"hidden_size: {c.get('hidden_size')!r}, but the target's is "
                       f"{target.hidden_size}")
        if c.get("vocab_size") != target.vocab_rows:
            out.append(f"vocab_size: {c.get('vocab_size')!r}, but the target has "
                       f"{target.vocab_rows} embedding rows")
        if "num_target_layers" in c and c["num_target_layers"] != target.num_layers:
            out.append(f"num_target_layers: {c['num_target_layers']!r}, but the target has "
                       f"{target.num_layers} layers")
    return out


def _full_problems(c: dict[str, Any]) -> list[str]:
    """The keys the readers need on top, all written by `config_dict`."""
    out: list[str] = []
    if c.get("architectures") != [ARCHITECTURE]:
        out.append(f"architectures: must be [\"{ARCHITECTURE}\"] (SGLang picks the class by "
                   f"it), got {c.get('architectures')!r}")
    if c.get("model_type") != "qwen3":
        out.append(f"model_type: must be \"qwen3\", got {c.get('model_type')!r}")
    if c.get("auto_map") != AUTO_MAP:
        out.append(f"auto_map: must be {AUTO_MAP}, got {c.get('auto_map')!r}")
    n = c.get("num_target_layers")
    if not _int(n) or n < 4:
        out.append(f"num_target_layers: must be the target's depth (at least 4), got {n!r}")
    rope = c.get("rope_parameters")
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    if theta is None or c.get("rope_theta") != theta:
        out.append(f"rope_theta {c.get('rope_theta')!r} and rope_parameters.rope_theta "
                   f"{theta!r}: both must be present and equal (4.57 reads only the first)")
    if c.get("dtype") not in SAFETENSORS_DTYPE or c.get("torch_dtype") != c.get("dtype"):
        out.append(f"dtype {c.get('dtype')!r} / torch_dtype {c.get('torch_dtype')!r}: must be "
                   "equal and one of " + ", ".join(SAFETENSORS_DTYPE))
    layer_types = c.get("layer_types")
    if layer_types is not None and layer_types != ["full_attention"] * int(
            c.get("num_hidden_layers") or 0):
        out.append(f"layer_types: {layer_types!r}; a plain drafter's layers are all "
                   "full_attention (SGLang makes a sliding layer causal)")
    if c.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act: {c.get('hidden_act')!r}; the drafter's MLP is SwiGLU (silu)")
    out += [f"{key}: must be absent for a plain DFlash drafter (an SGLang extension)"
            for key in EXTENSION_KEYS if c.get(key) not in (None, False)]
    return out


def _weight_problems(c: dict[str, Any], meta: dict[str, tuple[tuple[int, ...], str]],
                     check_dtype: bool) -> list[str]:
    try:
        want = expected_weights(c)
    except (KeyError, TypeError, ValueError) as exc:
        return [f"cannot tell the weights this config needs: {exc!r}"]
    out: list[str] = []
    missing = [k for k in want if k not in meta]
    extra = [k for k in meta if k not in want]
    if missing:
        out.append(f"{WEIGHTS}: missing {len(missing)} tensors the config needs, e.g. "
                   f"{missing[:3]}")
    if extra:
        out.append(f"{WEIGHTS}: {len(extra)} tensors the config does not have, e.g. "
                   f"{extra[:3]}")
    for name, shape in want.items():
        if name in meta and meta[name][0] != shape:
            out.append(f"{WEIGHTS}: {name} is {list(meta[name][0])}, the config says "
                       f"{list(shape)}")
    if check_dtype:
        stated = SAFETENSORS_DTYPE.get(str(c.get("dtype")))
        found = sorted({dt for _, dt in meta.values()})
        if stated is not None and found != [stated]:
            out.append(f"{WEIGHTS}: tensors are {found}, config.json says dtype "
                       f"{c.get('dtype')}")
    return out


def problems(folder: Path, target: TargetFacts | None = None, full: bool = True) -> list[str]:
    """Everything wrong with a checkpoint folder, each naming the file and the key.

    `full` adds the keys the readers need beyond our own code (all that `config_dict`
    writes), the modeling file and weights in the stated dtype; without it, a checkpoint
    of an older fleetdeck that export can complete passes.
    """
    try:
        c = read_config(folder)
    except ContractError as exc:
        return [str(exc)]
    found = [f"{folder / CONFIG}: {p}" for p in _core_problems(c, target)]
    if full:
        found += [f"{folder / CONFIG}: {p}" for p in _full_problems(c)]
        if not (folder / MODELING).is_file():
            found.append(f"{folder / MODELING}: missing (auto_map points at it)")
    try:
        meta = weight_meta(folder)
    except ContractError as exc:
        return [*found, str(exc)]
    if not any("dflash_config: missing" in p for p in found):
        found += [f"{folder}/{p}" for p in _weight_problems(c, meta, full)]
    return found


def check(folder: Path, target: TargetFacts | None = None, full: bool = True) -> None:
    found = problems(folder, target, full)
    if found:
        raise ContractError("; ".join(found))


def mask_token_problem(tokenizer: Any, mask_token_id: int) -> str | None:
    """SGLang refuses a config whose mask id differs from the tokenizer's `<|MASK|>`."""
    mapped = tokenizer.get_vocab().get(MASK_TOKEN)
    if mapped is not None and mapped != mask_token_id:
        return (f"dflash_config.mask_token_id is {mask_token_id}, but the tokenizer maps "
                f"{MASK_TOKEN} to {mapped}; SGLang refuses that")
    return None
