"""Online DFlash training throughput and acceptance, beside baselines measured in the same run.

Default (CPU): the tests' tiny 8-layer Qwen3 target, taught its repeat language, answers 240
prompts greedily; the drafter trains on that online for --steps steps. Printed:
- steps/s and tokens/s of training, beside the frozen target's own forward alone on the
  same batches (the floor of online training: the target runs every step);
- blocks/s of the block-masked trainer, beside a naive trainer that runs the drafter once
  per block (the same loss, no block mask);
- tau of real speculative decoding on held-out prompts (untrained, trained, context
  zeroed), and its tokens/s beside the target's plain greedy decoding.

    .venv/bin/python benchmarks/train.py [--steps 200] [--threads 1] [--keep DIR]

With a GPU: `--device cuda --hidden 2048 --layers 28 --peak-tflops 989` trains against a
larger random target in bf16 and adds peak memory and the share of the GPU's bf16 peak
(no teaching, no tau: a random target's answers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.rundir.spec import load_spec
from tests.trainer.tinyworld import (
    build_world,
    cycle_prompt,
    greedy_lines,
    word_lines,
    write_batches,
    write_spec,
)
from trainer import distributed
from trainer.blocks import block_tokens, sample_anchors
from trainer.data import load_batch
from trainer.drafter import DFlashDrafter
from trainer.evaluate import stop_tokens
from trainer.objective import Batch, BlockStats
from trainer.prepare import PrepareSettings, prepare
from trainer.speculative import compare, greedy, speculative
from trainer.target import features
from trainer.train import Trainer, TrainOptions, anchor_seed


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def naive_blocks_per_s(tr: Trainer, batches: list[Batch], seconds: float = 10.0) -> float:
    """The same loss, one drafter call per block: its context and its own tokens only."""
    bsz = tr.cfg.block_size
    weights = tr.weights.to(tr.device)
    blocks = 0
    t0 = time.perf_counter()
    for step, batch in enumerate(batches):
        feats = features(tr.target, batch.input_ids, batch.attention_mask,
                         tr.settings.target_layer_ids)
        anchors = sample_anchors(batch.loss_mask.cpu(), batch.lengths.cpu(), tr.cfg.anchors,
                                 bsz, torch.Generator().manual_seed(anchor_seed(0, 0, step, 0)))
        for r in range(batch.input_ids.shape[0]):
            for a in anchors.positions[r][anchors.valid[r]].tolist():
                ids = batch.input_ids[r: r + 1]
                block = block_tokens(ids, torch.tensor([[a]], device=tr.device), bsz,
                                     tr.settings.mask_token_id)
                pos = torch.arange(a, a + bsz, device=tr.device)[None]
                ctx_pos = torch.arange(a, device=tr.device)[None]
                hidden = tr.drafter(tr.embed(block), feats[r: r + 1, :a], pos, ctx_pos)
                labels = ids[0, a: a + bsz]
                w = weights[: len(labels)] * batch.loss_mask[r, a: a + bsz]
                ce = torch.nn.functional.cross_entropy(
                    tr.head(hidden[0, : len(labels)]).float(), labels, reduction="none")
                ((ce * w).sum() / w.sum().clamp_min(1e-9)).backward()
                blocks += 1
        sync(tr.device)
        if time.perf_counter() - t0 > seconds:
            break
    tr.opt.zero_grad(set_to_none=True)
    return blocks / (time.perf_counter() - t0)


def target_tokens_per_s(tr: Trainer, batches: list[Batch]) -> float:
    tokens = 0
    sync(tr.device)
    t0 = time.perf_counter()
    for batch in batches:
        features(tr.target, batch.input_ids, batch.attention_mask, tr.settings.target_layer_ids)
        tokens += int(batch.lengths.sum())
    sync(tr.device)
    return tokens / (time.perf_counter() - t0)


def decode(tr: Trainer, drafter: DFlashDrafter, tok: Any, n: int,
           zero: bool = False) -> dict[str, float]:
    stop = stop_tokens(tr.target, tok)
    per_fwd: list[int] = []
    spec_tokens = greedy_tokens = 0
    spec_s = greedy_s = 0.0
    equal = 0
    for i in range(min(n, len(tr.heldout))):
        row = tr.heldout.row(i)
        prompt = torch.as_tensor(row.input_ids[: row.prompt_len], device=tr.device)[None]
        t0 = time.perf_counter()
        got = speculative(tr.target, drafter, prompt, 44, stop, zero)
        t1 = time.perf_counter()
        ref = greedy(tr.target, prompt, 44, stop)
        greedy_s += time.perf_counter() - t1
        spec_s += t1 - t0
        per_fwd += got.per_forward
        spec_tokens += len(got.tokens)
        greedy_tokens += len(ref.tokens)
        equal += compare(got, ref, 1e-3).equal
    return {"tau": sum(per_fwd) / max(1, len(per_fwd)), "spec_tok_s": spec_tokens / spec_s,
            "greedy_tok_s": greedy_tokens / greedy_s, "equal": equal}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="the device's dense bf16 peak, for the share of it used")
    ap.add_argument("--keep", help="keep the run here instead of a temporary folder")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tiny = args.device == "cpu" and args.hidden == 64
    with tempfile.TemporaryDirectory(prefix="fd-train-bench-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        world = build_world(root / "target", teach_steps=100 if tiny else 0,
                            layers=args.layers, hidden=args.hidden)
        teach_s = time.perf_counter() - t0
        if tiny:
            rng = random.Random(1234)
            lines = greedy_lines(world.model, world.tokenizer,
                                 [cycle_prompt(rng) for _ in range(240)], max_new_tokens=44)
        else:
            lines = word_lines(400, words=(200, 400))
        write_batches(root / "data", lines)
        spec_path = write_spec(root / "run.toml", str(root / "data"), world.target,
                               root / "run", max_steps=args.steps + 5, keep_truncated=True,
                               max_under_min_share=0.5, eval_prompts=8,
                               dtype="auto" if args.device != "cpu" else "float32")
        spec = load_spec(spec_path)
        assert spec.train is not None
        prepare(PrepareSettings(str(root / "data"), str(world.target), root / "run/prepared",
                                keep_truncated=True, max_under_min_share=0.5,
                                heldout_share=0.1))
        tr = Trainer(spec, spec.train, TrainOptions(), distributed.init())
        tok = world.tokenizer
        before = decode(tr, tr.drafter, tok, 8) if tiny else None
        for _ in range(5):  # warm-up
            tr.train_step()
        if tr.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync(tr.device)
        total = BlockStats(tr.cfg.block_size)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            total.add(tr.train_step())
        sync(tr.device)
        train_s = time.perf_counter() - t0
        steps_s = args.steps / train_s
        tok_s = total.tokens / train_s
        blocks_s = float(total.values[3]) / train_s
        batches = [load_batch(tr.train_set, tr.plan.rows(s, 0)).to(tr.device)
                   for s in range(min(20, args.steps))]
        target_s = target_tokens_per_s(tr, batches)
        naive_s = naive_blocks_per_s(tr, batches)
        after = decode(tr, tr.drafter, tok, 8) if tiny else None
        zeroed = decode(tr, tr.drafter, tok, 8, zero=True) if tiny else None

    print(f"target: {args.layers} layers, hidden {args.hidden}, {args.device}; drafter "
          f"{spec.train.drafter_layers} layer(s); batch {spec.train.batch_size} x up to "
          f"{spec.train.anchors} anchors x block {spec.train.block_size}; "
          f"{args.threads} thread(s); target taught in {teach_s:.1f} s")
    print(f"training      {steps_s:8.2f} steps/s  {tok_s:9.0f} tokens/s   "
          f"target forward alone {target_s:9.0f} tokens/s   ratio {tok_s / target_s:.3f}")
    print(f"blocks        {blocks_s:8.0f} blocks/s (block mask)        "
          f"naive per-block loop {naive_s:9.0f} blocks/s   ratio {blocks_s / naive_s:.1f}")
    result: dict[str, object] = {
        "steps_per_s": steps_s, "tokens_per_s": tok_s, "target_forward_tokens_per_s": target_s,
        "blocks_per_s": blocks_s, "naive_blocks_per_s": naive_s,
        "train_accept_length": total.accept_length,
    }
    if before and after and zeroed:
        print(f"tau           untrained {before['tau']:.2f}   trained {after['tau']:.2f}   "
              f"context zeroed {zeroed['tau']:.2f}   (8 held-out prompts, "
              f"{after['equal']}/8 equal to greedy)")
        print(f"decoding      speculative {after['spec_tok_s']:7.0f} tokens/s   greedy "
              f"{after['greedy_tok_s']:7.0f} tokens/s   ratio "
              f"{after['spec_tok_s'] / after['greedy_tok_s']:.2f}")
        result.update(tau_untrained=before["tau"], tau=after["tau"], tau_zeroed=zeroed["tau"],
                      speculative_tokens_per_s=after["spec_tok_s"],
                      greedy_tokens_per_s=after["greedy_tok_s"])
    if tr.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
        # Training FLOPs ~ 2 x target params x tokens (forward) + 6 x drafter params x
        # block tokens (forward and backward).
        tp = sum(p.numel() for p in tr.target.parameters())
        dp = sum(p.numel() for p in tr.drafter.parameters())
        flops = 2 * tp * tok_s + 6 * dp * blocks_s * tr.cfg.block_size
        print(f"gpu           peak memory {peak:.1f} GiB   {flops / 1e12:.1f} TFLOP/s"
              + (f"   {flops / 1e12 / args.peak_tflops:.1%} of bf16 peak"
                 if args.peak_tflops else ""))
        result.update(peak_gib=peak, tflops=flops / 1e12)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
