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

Then the attention of the training step at the paper's size (3,072 tokens, 512 anchors,
block 16), each variant in its own process: peak memory and tokens/s of the drafter with
the dense boolean mask through SDPA (the baseline) and with flex_attention's BlockMask from
the same rule. On the CPU: forward passes (torch 2.13 has no flex backward on the CPU; flex
eager, as the tests run it, and compiled) and SDPA's training step; on a GPU: training steps
(forward and backward, bf16 autocast) of both. `--only-attention` skips the rest;
`--attention-hidden`/`--attention-layers` size the drafter (default: 256 and 1 on the CPU,
Qwen3-8B's 4096 and 5 layers on a GPU); `--attention-tokens`/`--attention-anchors` shrink the
step itself (the tests' smoke size; the figures that count are at the default).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config

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
from trainer.blocks import block_mask, block_tokens, flex_block_mask, position_ids, sample_anchors
from trainer.contract import DFlashSettings, drafter_config
from trainer.data import load_batch
from trainer.drafter import DFlashDraftModel
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
                hidden = tr.drafter(position_ids=torch.cat([ctx_pos, pos], dim=1),
                                    noise_embedding=tr.embed(block),
                                    target_hidden=feats[r: r + 1, :a])
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


def decode(tr: Trainer, drafter: DFlashDraftModel, tok: Any, n: int,
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


ATTN_TOKENS, ATTN_ANCHORS, ATTN_BLOCK = 3072, 512, 16
# (variant, device): CPU forward passes of both and SDPA's training step; GPU training steps.
ATTN_VARIANTS = {"cpu": ["sdpa-forward", "flex-eager-forward", "flex-compiled-forward",
                         "sdpa-train"],
                 "cuda": ["sdpa-train", "flex-train"]}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssPeak:
    """The highest resident set size while it runs, sampled every 2 ms (CPU)."""

    def __enter__(self) -> RssPeak:
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def attention_variant(variant: str, device: torch.device, hidden: int, layers: int,
                      tokens: int = ATTN_TOKENS, anchors_n: int = ATTN_ANCHORS) -> dict[str, Any]:
    """One drafter step at 3,072 tokens x 512 anchors x block 16 (by default); run in its
    own process."""
    import trainer.drafter as drafter_module

    warnings.filterwarnings("ignore", message=".*flex_attention called without")
    heads = max(1, hidden // 128) if device.type == "cuda" else max(1, hidden // 64)
    target = Qwen3Config(vocab_size=1024, hidden_size=hidden, intermediate_size=3 * hidden,
                         num_hidden_layers=36, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 4), head_dim=hidden // heads,
                         max_position_embeddings=8192)
    settings = DFlashSettings(ATTN_BLOCK, 1023, [1, 9, 17, 25, 33])
    torch.manual_seed(0)
    model = DFlashDraftModel(drafter_config(target, layers, settings))
    torch.nn.Module.to(model, device)
    s, n, b = tokens, anchors_n, ATTN_BLOCK
    gen = torch.Generator().manual_seed(0)
    anchors = torch.randperm(s - 2, generator=gen)[:n].sort().values[None].to(device)
    feats = torch.randn(1, s, 5 * hidden, device=device)
    noise = torch.randn(1, n * b, hidden, device=device)
    pos = position_ids(anchors, s, b)
    train = variant.endswith("train")
    if variant == "flex-compiled-forward":
        compiled = torch.compile(torch.nn.attention.flex_attention.flex_attention)

        def flex(q, k, v, block_mask, scale):  # type: ignore[no-untyped-def]
            return compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)

        drafter_module._flex_attention = flex  # the CPU path compiled, for this figure only
    def step() -> None:
        if variant.startswith("flex"):
            mask = flex_block_mask(anchors, None, s, b,
                                   compile=None if device.type == "cuda" else "compiled" in variant)
        else:
            mask = block_mask(anchors, None, s, b)
        ctx = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else \
            torch.autocast("cpu", enabled=False)
        with ctx, torch.set_grad_enabled(train):
            out = model(position_ids=pos, attention_mask=mask, noise_embedding=noise,
                        target_hidden=feats)
            if train:
                out.float().pow(2).mean().backward()
                model.zero_grad(set_to_none=True)

    warm = device.type == "cuda" or variant == "flex-compiled-forward"
    if warm:  # compile and allocator warm-up, not measured
        step()
    repeats = 5 if device.type == "cuda" else 1
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / repeats
        peak = torch.cuda.max_memory_allocated() - base
    else:
        with RssPeak() as rss:
            t0 = time.perf_counter()
            step()
            seconds = time.perf_counter() - t0
        peak = rss.peak - rss.base
    return {"variant": variant, "device": device.type, "hidden": hidden, "layers": layers,
            "heads": heads, "peak_mib": peak / 2**20, "seconds": seconds,
            "tokens_per_s": s / seconds, "warm": warm}


def attention_figures(device: str, hidden: int | None, layers: int | None, threads: int,
                      tokens: int = ATTN_TOKENS,
                      anchors: int = ATTN_ANCHORS) -> list[dict[str, Any]]:
    cuda = device == "cuda"
    hidden = hidden or (4096 if cuda else 256)
    layers = layers or (5 if cuda else 1)
    rows: list[dict[str, Any]] = []
    for variant in ATTN_VARIANTS["cuda" if cuda else "cpu"]:
        proc = subprocess.run(
            [sys.executable, __file__, "--attention-variant", variant, "--device", device,
             "--attention-hidden", str(hidden), "--attention-layers", str(layers),
             "--threads", str(threads), "--attention-tokens", str(tokens),
             "--attention-anchors", str(anchors)], capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            rows.append({"variant": variant, "error": proc.stderr.strip()[-400:]})
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = next((r for r in rows if r.get("variant") == rows[0]["variant"]
                 and "error" not in r), None)
    print(f"attention     {tokens} tokens, {anchors} anchors x block {ATTN_BLOCK}, "
          f"drafter {layers} layer(s) width {hidden}, {device}, {threads} thread(s); "
          f"baseline {rows[0]['variant']}")
    for r in rows:
        if "error" in r:
            print(f"  {r['variant']:22s} failed: {r['error']}")
            continue
        ratio = (f"   memory x{r['peak_mib'] / base['peak_mib']:.3g}, speed "
                 f"x{r['tokens_per_s'] / base['tokens_per_s']:.3g}" if base else "")
        print(f"  {r['variant']:22s} peak {r['peak_mib']:8.0f} MiB   "
              f"{r['tokens_per_s']:8.0f} tokens/s{ratio}")
    if not cuda:
        print("  GPU figures (training steps of sdpa and flex): not run, no GPU here; "
              "run with --device cuda")
    return rows


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
    ap.add_argument("--only-attention", action="store_true",
                    help="only the attention figures (3,072 tokens, 512 anchors, block 16)")
    ap.add_argument("--attention-hidden", type=int)
    ap.add_argument("--attention-layers", type=int)
    ap.add_argument("--attention-tokens", type=int, default=ATTN_TOKENS)
    ap.add_argument("--attention-anchors", type=int, default=ATTN_ANCHORS)
    ap.add_argument("--attention-variant", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.attention_variant:
        print(json.dumps(attention_variant(args.attention_variant, torch.device(args.device),
                                           args.attention_hidden, args.attention_layers,
                                           args.attention_tokens, args.attention_anchors)))
        return 0
    if args.only_attention:
        attention_figures(args.device, args.attention_hidden, args.attention_layers,
                          args.threads, args.attention_tokens, args.attention_anchors)
        return 0
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
    result["attention"] = attention_figures(args.device, args.attention_hidden,
                                            args.attention_layers, args.threads,
                                            args.attention_tokens, args.attention_anchors)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
