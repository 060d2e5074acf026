"""The memory plan of a training run: bytes per rank, from the target's config.json and the
[train] section alone (no weights, no GPU), and whether that fits the GPUs.

`fleetdeck-train plan RUN.toml [--gpus N --gpu-mem GiB]` prints it; `train` refuses a run
that does not fit unless `[train] allow_unfit` (or `--allow-unfit`). The sequence length is
`max_length`, or the longest sample `prepare` kept when its report exists. Per rank, with
H the width, I the MLP width, V the vocab, nh x d and nkv x d the query and key/value
widths, b the batch, S the length, N the anchors, B the block, Q = N x B the block tokens,
K = S + Q the keys, F the feature layers, D the drafter layers, c the loss chunk, e the
activation bytes (2 in bf16 autocast, 4 in fp32) and w the world size:

- target weights: (V x H x (1 or 2 if untied) + (deepest + 1) x layer + H) x target bytes
  (the lean target: no layer past the deepest feature layer);
- kept hidden states: b x S x F x H x target bytes;
- drafter parameters, gradients, AdamW's two moments: 4, 4 and 8 bytes a parameter
  (sharded: each / w, plus two layers gathered in the compute dtype); replicated under DDP
  with w > 1, its gradient buckets: 4 more;
- activations at the configured batch: e x (D x b x (Q x (6H + 5 nh d + 4I) + K x 5 nkv d)
  + b x (9 Q H + 4 S H));
- the loss's working set: c x V x 9 bytes (fp32 logits, logsumexp's temporary), 13 in bf16
  (the bf16 logits and gradient besides);
- the target's forward (before the drafter's): e x b x S x (4H + 3I + (nh + 2 nkv) d) + the
  b x S x S mask.

The peak is the persistent rows plus the larger of the target's forward, the drafter's
forward with the loss, and the gradients. The activation and loss coefficients are counts of
what autograd keeps, checked against torch's own peak on the CPU at small sizes
(tests/trainer/test_memplan.py, within 15%). A run fits when the peak plus a reserve (CUDA
context, allocator: 1.5 GiB and 5% of the GPU) is within the GPU's memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

GIB = 2**30
RESERVE_BYTES = int(1.5 * GIB)
RESERVE_SHARE = 0.05


class MemoryPlanError(ValueError):
    """Inputs the plan cannot read (the target's config.json); the message names the key."""


@dataclass(frozen=True)
class TargetShape:
    """The target's dimensions, from its config.json (a multimodal config's text part)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False
    attention_bias: bool = False

    @classmethod
    def read(cls, folder: str | Path) -> TargetShape:
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise MemoryPlanError(f"{path}: cannot read the target's config: {exc}") from None
        if not isinstance(raw, dict):
            raise MemoryPlanError(f"{path}: not a JSON object")
        return cls.of(raw, str(path))

    @classmethod
    def of(cls, raw: dict[str, Any], where: str = "config.json") -> TargetShape:
        text = raw.get("text_config")
        cfg = text if isinstance(text, dict) else raw

        def num(key: str, default: int | None = None) -> int:
            value = cfg.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MemoryPlanError(f"{where}: {key}: {value!r}, expected a positive integer")
            return value

        heads = num("num_attention_heads")
        hidden = num("hidden_size")
        return cls(num("num_hidden_layers"), hidden, num("intermediate_size"), heads,
                   num("num_key_value_heads", heads), num("head_dim", hidden // heads),
                   num("vocab_size"), bool(raw.get("tie_word_embeddings", False)),
                   bool(cfg.get("attention_bias", False)))

    def layer_params(self, intermediate: int | None = None) -> int:
        """One Qwen3 decoder layer: attention (q, k, v, o; q/k norms), MLP, two norms."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        i = self.intermediate if intermediate is None else intermediate
        bias = q + 2 * kv + h if self.attention_bias else 0  # q, k, v and o
        return 2 * h * q + 2 * h * kv + 2 * self.head_dim + 3 * h * i + 2 * h + bias

    def target_params(self, keep_layers: int) -> int:
        heads = 1 if self.tied else 2
        return heads * self.vocab * self.hidden + keep_layers * self.layer_params() + self.hidden

    def drafter_params(self, layers: int, features: int) -> int:
        """z-lab's drafter at this width: `layers` layers, fc (F x H -> H), two norms."""
        return (layers * self.layer_params() + features * self.hidden * self.hidden
                + 2 * self.hidden)


@dataclass(frozen=True)
class PlanInputs:
    shape: TargetShape
    feature_layers: list[int]
    drafter_layers: int
    batch: int
    seq: int
    anchors: int
    block: int
    loss_chunk: int
    world: int = 1
    sharded: bool = False
    bf16: bool = True
    # GPU memory per rank (None: unknown, the plan cannot say whether it fits).
    capacity: int | None = None
    # Where the length came from, for the table.
    seq_from: str = "max_length"


@dataclass(frozen=True)
class Row:
    name: str
    bytes: int
    how: str
    persistent: bool = True


@dataclass(frozen=True)
class MemoryPlan:
    inputs: PlanInputs
    rows: list[Row]
    peak: int
    needs_sharding: bool = False
    reserve: int = field(default=0)

    @property
    def fits(self) -> bool | None:
        cap = self.inputs.capacity
        return None if cap is None else self.peak + self.reserve <= cap

    @property
    def margin(self) -> int | None:
        cap = self.inputs.capacity
        return None if cap is None else cap - self.reserve - self.peak

    def table(self) -> str:
        i = self.inputs
        lines = [f"memory plan per rank: {i.world} rank(s), "
                 f"{'sharded (FSDP)' if i.sharded else 'replicated'}, "
                 f"{'bf16' if i.bf16 else 'fp32'}; batch {i.batch} x {i.seq} tokens "
                 f"({i.seq_from}), {i.anchors} anchors x block {i.block}, "
                 f"loss chunk {i.loss_chunk}"]
        for r in self.rows:
            kind = "" if r.persistent else "  (at its phase)"
            lines.append(f"  {r.name:26s} {r.bytes / GIB:9.2f} GiB   {r.how}{kind}")
        lines.append(f"  {'peak':26s} {self.peak / GIB:9.2f} GiB")
        cap = i.capacity
        if cap is None:
            lines.append("  GPU memory unknown: pass --gpu-mem GiB (or [train] gpu_mem_gib)")
        else:
            margin = self.margin or 0
            verdict = ("fits" if self.fits else "does NOT fit")
            lines.append(f"  {verdict}: {self.peak / GIB:.2f} + {self.reserve / GIB:.2f} GiB "
                         f"reserve of {cap / GIB:.2f} GiB, margin {margin / GIB:+.2f} GiB "
                         f"({margin / cap:+.0%})")
        if self.needs_sharding:
            lines.append("  replicated it does not fit; sharded over the ranks (FSDP) it does")
        return "\n".join(lines)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def plan(i: PlanInputs) -> MemoryPlan:
    """The plan for `i`; `needs_sharding` says whether only the sharded layout fits."""
    built = _plan(i)
    if not i.sharded and i.world > 1 and built.fits is False:
        sharded = _plan(replace(i, sharded=True))
        if sharded.fits:
            return replace(built, needs_sharding=True)
    return built


def _plan(i: PlanInputs) -> MemoryPlan:
    s = i.shape
    t_bytes = 2 if i.bf16 else 4
    e = 2 if i.bf16 else 4
    keep = max(i.feature_layers) + 1
    feats = len(i.feature_layers)
    b, seq = i.batch, i.seq
    anchors = min(i.anchors, seq)
    q_tok = anchors * i.block
    k_tok = seq + q_tok
    labelled = b * anchors * (i.block - 1)
    chunk = min(i.loss_chunk, labelled)
    pd = s.drafter_params(i.drafter_layers, feats)
    shard = i.world if i.sharded else 1
    rows = [
        Row("target weights", s.target_params(keep) * t_bytes,
            f"{keep} of {s.layers} layers, vocab {s.vocab}, {t_bytes} B/param"),
        Row("kept hidden states", b * seq * feats * s.hidden * t_bytes,
            f"b x S x {feats} x H"),
        Row("drafter parameters", pd * 4 // shard, f"{pd / 1e9:.2f} B params, fp32"
            + (f" / {shard}" if shard > 1 else "")),
        Row("optimizer (AdamW)", pd * 8 // shard, "2 moments, fp32"
            + (f" / {shard}" if shard > 1 else "")),
    ]
    if i.sharded and i.world > 1:
        rows.append(Row("gathered layers (FSDP)", 2 * s.layer_params() * e,
                        "two layers unsharded at a time"))
    elif i.world > 1:
        rows.append(Row("DDP gradient buckets", pd * 4, "a flat copy of the gradients"))
    grads = Row("gradients", pd * 4 // shard, "fp32" + (f" / {shard}" if shard > 1 else ""),
                persistent=False)
    nhd, nkvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
    acts = e * (i.drafter_layers * b * (q_tok * (6 * s.hidden + 5 * nhd + 4 * s.intermediate)
                                        + k_tok * 5 * nkvd)
                + b * (9 * q_tok * s.hidden + 4 * seq * s.hidden))
    activations = Row("drafter activations", acts,
                      f"{i.drafter_layers} layers x {b} x ({q_tok} block + {k_tok} key tokens)",
                      persistent=False)
    loss = Row("loss working set", chunk * s.vocab * (13 if i.bf16 else 9),
               f"{chunk} positions x vocab {s.vocab}", persistent=False)
    target_fwd = Row("target forward", e * b * seq * (4 * s.hidden + 3 * s.intermediate
                                                      + (s.heads + 2 * s.kv_heads) * s.head_dim)
                     + b * seq * seq, "one layer's working set and the mask",
                     persistent=False)
    rows += [activations, loss, grads, target_fwd]
    persistent = sum(r.bytes for r in rows if r.persistent)
    peak = persistent + max(acts + loss.bytes, grads.bytes, target_fwd.bytes)
    reserve = RESERVE_BYTES + int(RESERVE_SHARE * i.capacity) if i.capacity else 0
    return MemoryPlan(i, rows, peak, reserve=reserve)


def capacity_of(gpu_mem_gib: float | None) -> int | None:
    """GPU memory per rank: the given GiB, else the first GPU's own, else unknown."""
    if gpu_mem_gib is not None:
        return int(gpu_mem_gib * GIB)
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return None


def plan_run(spec: Any, cfg: Any, gpus: int | None = None, gpu_mem_gib: float | None = None,
             sharded: bool = False, bf16: bool | None = None) -> MemoryPlan:
    """The plan of a run.toml's [train]: the target's config.json, the spec, and prepare's
    length report when there is one (its longest sample as kept, else max_length)."""
    from agents.rundir.spec import DEFAULT_MAX_LENGTH
    from trainer.drafter import build_target_layer_ids
    from trainer.paths import resolve
    from trainer.report import REPORT_NAME, report_decoder

    paths = resolve(spec, cfg)
    shape = TargetShape.read(paths.target)
    ids = cfg.target_layer_ids
    if ids is None:
        try:
            ids = build_target_layer_ids(shape.layers, cfg.target_features)
        except ValueError as exc:
            raise MemoryPlanError(f"[train] target_features: {exc}") from None
    elif max(ids) > shape.layers - 2:
        raise MemoryPlanError(f"[train] target_layer_ids: {max(ids)} not in 0..{shape.layers - 2}"
                              f" (the target has {shape.layers} layers)")
    seq = DEFAULT_MAX_LENGTH if cfg.max_length is None else cfg.max_length
    seq_from = "max_length"
    report_path = paths.prepared / REPORT_NAME
    if report_path.exists():
        try:
            lengths = report_decoder.decode(report_path.read_bytes()).lengths
        except Exception:  # msgspec's errors: `train` names them; the plan goes on
            lengths = None
        if lengths is not None and lengths.longest_kept > 0:
            seq, seq_from = lengths.longest_kept, "prepare's longest sample"
    if bf16 is None:
        bf16 = cfg.dtype != "float32"
    world = gpus if gpus is not None else cfg.nproc * cfg.nodes
    return plan(PlanInputs(shape, sorted(ids), cfg.drafter_layers, cfg.batch_size, seq,
                           cfg.anchors, cfg.block_size, cfg.loss_chunk, world, sharded, bf16,
                           capacity_of(gpu_mem_gib if gpu_mem_gib is not None
                                       else cfg.gpu_mem_gib), seq_from))
