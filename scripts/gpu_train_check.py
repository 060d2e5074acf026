"""The trainer on one GPU at a real size, in minutes: a random target of Qwen3-8B's shape in
bf16 (lean: the layers up to the deepest feature layer), the drafter at the paper's size (5
layers), `--steps` training steps with flex_attention compiled and the chunked loss. Prints
tokens/s, MFU against the chip's dense bf16 peak (the figure is named), and the peak memory
against the memory plan's (trainer/memplan.py).

    python scripts/gpu_train_check.py [--steps 100] [--batch 4] [--peak-tflops 989]
    python scripts/gpu_train_check.py --toy        # the same path on the CPU, tiny sizes

Run through scripts/gpu_train_check.sh on a lent machine (it installs carried wheels).
Random weights: the loss and accuracy mean nothing, only speed and memory do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import Qwen3Config, Qwen3ForCausalLM

from trainer.blocks import position_weights, sample_anchors
from trainer.contract import DFlashSettings, drafter_config
from trainer.drafter import DFlashDraftModel, build_target_layer_ids
from trainer.memplan import GIB, PlanInputs, TargetShape, plan
from trainer.objective import Batch, attention_for, block_loss
from trainer.target import features

# NVIDIA's datasheet figure for H100/H200 SXM: 989 TFLOP/s dense BF16 (1,979 with sparsity).
H200_DENSE_BF16_TFLOPS = 989.0
QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936}
TOY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
       "vocab_size": 2048}


def build_target(shape: dict[str, int], keep: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[Qwen3Config, torch.nn.Module]:
    """The full config, and a random target of `keep` layers built on the device in `dtype`
    (no host copy, nothing read from disk)."""
    full = Qwen3Config(**shape, max_position_embeddings=32768, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    lean = Qwen3Config(**{**shape, "num_hidden_layers": keep}, max_position_embeddings=32768,
                       tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(lean)
    finally:
        torch.set_default_dtype(old)
    model.eval().requires_grad_(False)
    return full, model


def step_flops(shape: TargetShape, keep: int, drafter_params: int, b: int, seq: int,
               anchors: int, block: int, drafter_layers: int) -> float:
    """Model FLOPs of one step: the target's forward (2 per parameter per token, causal
    attention), the drafter's forward and backward (6 per parameter per block token, its
    attention to the context before the anchor, half the sequence on average, and its
    block), and the LM head's forward and gradient (4 n H V)."""
    nhd = shape.heads * shape.head_dim
    target_params = keep * shape.layer_params()
    target = 2 * target_params * b * seq + 2 * b * seq * seq * nhd * keep  # QK and AV, causal
    q = anchors * block
    drafter = 6 * drafter_params * b * q + 3 * 4 * b * q * (seq / 2 + block) * nhd \
        * drafter_layers
    head = 4 * b * anchors * (block - 1) * shape.hidden * shape.vocab
    return float(target + drafter + head)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--toy", action="store_true", help="the CPU path at a tiny size (a test)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3, help="steps before timing (compile)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--drafter-layers", type=int, default=5)
    ap.add_argument("--loss-chunk", type=int, default=1024)
    ap.add_argument("--peak-tflops", type=float, default=H200_DENSE_BF16_TFLOPS,
                    help="the chip's dense bf16 peak (default H200 SXM: 989)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if args.toy:
        device, dtype, shape_cfg = torch.device("cpu"), torch.float32, TOY
        args.seq, args.anchors = min(args.seq, 128), min(args.anchors, 8)
        args.batch, args.drafter_layers = min(args.batch, 2), min(args.drafter_layers, 2)
        args.loss_chunk = min(args.loss_chunk, 64)
    elif not torch.cuda.is_available():
        print("gpu_train_check: no GPU here (use --toy for the CPU path)", file=sys.stderr)
        return 2
    else:
        device, dtype, shape_cfg = torch.device("cuda"), torch.bfloat16, QWEN3_8B
    block = 16
    t0 = time.perf_counter()
    ids_l = build_target_layer_ids(shape_cfg["num_hidden_layers"], 5)
    keep = max(ids_l) + 1
    torch.manual_seed(0)
    full, target = build_target(shape_cfg, keep, dtype, device)
    vocab = shape_cfg["vocab_size"]
    drafter = DFlashDraftModel(drafter_config(full, args.drafter_layers, DFlashSettings(
        block, vocab - 1, ids_l))).float().to(device)
    opt = torch.optim.AdamW(drafter.parameters(), lr=6e-4)
    weights = position_weights(block, 7.0).to(device)
    attention = attention_for(device)
    build_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)
    b, seq = args.batch, args.seq
    prompt = seq // 10
    mask = torch.zeros(b, seq, dtype=torch.bool)
    mask[:, prompt:] = True
    lengths = torch.full((b,), seq)

    def one_step(step: int) -> float:
        ids = torch.randint(0, vocab - 1, (b, seq), generator=gen)
        batch = Batch(ids, mask, torch.ones_like(ids), lengths).to(device)
        anchors = sample_anchors(mask, lengths, args.anchors, block,
                                 torch.Generator().manual_seed(step))
        feats = features(target, batch.input_ids, batch.attention_mask, ids_l)
        ctx = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else \
            torch.autocast("cpu", enabled=False)
        with ctx:
            loss, _ = block_loss(drafter, target.get_input_embeddings(),
                                 target.get_output_embeddings(), feats, batch, anchors,
                                 vocab - 1, weights, attention, args.loss_chunk)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    t1 = time.perf_counter()
    for s in range(args.warmup):
        one_step(s)
    sync()
    warm_s = time.perf_counter() - t1
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t2 = time.perf_counter()
    for s in range(args.steps):
        last = one_step(args.warmup + s)
    sync()
    run_s = time.perf_counter() - t2
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None

    shape = TargetShape.of(full.to_dict())
    pd = sum(p.numel() for p in drafter.parameters())
    capacity = (torch.cuda.get_device_properties(0).total_memory if device.type == "cuda"
                else None)
    planned = plan(PlanInputs(shape, ids_l, args.drafter_layers, b, seq, args.anchors, block,
                              args.loss_chunk, 1, False, dtype == torch.bfloat16, capacity,
                              "this check's length"))
    tokens_s = b * seq * args.steps / run_s
    flops = step_flops(shape, keep, pd, b, seq, args.anchors, block, args.drafter_layers)
    achieved = flops * args.steps / run_s / 1e12
    mfu = achieved / args.peak_tflops
    print(f"gpu_train_check: {device.type}, target {shape.layers} layers (lean: {keep}) x "
          f"width {shape.hidden}, vocab {shape.vocab}, {str(dtype).removeprefix('torch.')}; "
          f"drafter {args.drafter_layers} layers ({pd / 1e9:.2f} B params); batch {b} x {seq}"
          f" tokens, {args.anchors} anchors x block {block}; attention {attention}")
    print(f"time          build {build_s:.1f} s, warm-up ({args.warmup} steps, compile) "
          f"{warm_s:.1f} s, {args.steps} steps {run_s:.1f} s; last loss {last:.3f}")
    print(f"throughput    {tokens_s:,.0f} tokens/s, {args.steps / run_s:.2f} steps/s")
    print(f"MFU           {achieved:.1f} TFLOP/s of {args.peak_tflops:.0f} (dense bf16 peak"
          f"{': H200 SXM datasheet' if args.peak_tflops == H200_DENSE_BF16_TFLOPS else ''})"
          f" = {mfu:.1%}")
    if peak is not None:
        print(f"peak memory   {peak / GIB:.2f} GiB measured, plan {planned.peak / GIB:.2f} GiB"
              f" (measured/plan {peak / planned.peak:.2f})")
    else:
        print(f"peak memory   n/a on the CPU; plan {planned.peak / GIB:.4f} GiB")
    print(planned.table())
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device.type, "tokens_per_s": tokens_s, "tflops": achieved, "mfu": mfu,
            "peak_tflops": args.peak_tflops, "peak_bytes": peak,
            "plan_peak_bytes": planned.peak, "steps": args.steps, "run_s": run_s,
            "warmup_s": warm_s, "build_s": build_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
