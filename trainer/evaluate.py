"""`fleetdeck-train evaluate`: real speculative decoding on held-out prompts.

The prompts are the held-out samples' own prompts (the tokens before the generated turn).
For each: speculative decoding with the checkpoint's drafter, and the target's plain greedy
decoding; tau, tokens/s of both, and whether the outputs are equal (a difference is allowed
only where the target's two top logits were nearly tied; those are counted).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import msgspec
import torch
from transformers import Qwen3Config

from agents.rundir.spec import RunSpec, TrainSection
from trainer import checkpoint as ckpt
from trainer.drafter import DFlashDrafter
from trainer.paths import resolve
from trainer.shards import ShardSet
from trainer.speculative import compare, greedy, speculative
from trainer.target import load_target
from trainer.train import resolve_dtype

log = logging.getLogger("fleetdeck.train.evaluate")


class EvaluateError(ValueError):
    pass


class PromptResult(msgspec.Struct):
    index: int
    prompt_tokens: int
    tokens: int
    tau: float
    equal: bool
    near_tie: bool
    first_difference: int | None


class EvalReport(msgspec.Struct):
    checkpoint: str
    prompts: int
    tau: float
    tokens: int
    target_forwards: int
    equal: int
    near_ties: int
    mismatches: int
    zero_context: bool
    tie_margin: float
    speculative_tokens_per_s: float
    greedy_tokens_per_s: float
    speedup: float
    results: list[PromptResult]
    created_at: float = msgspec.field(default_factory=time.time)


def choose_checkpoint(out: Path, which: str) -> Path:
    """A folder, or "best" (best.json, else the latest) or "last"."""
    if which not in ("best", "last"):
        path = Path(which)
        if not (path / ckpt.WEIGHTS).exists():
            raise EvaluateError(f"{path}: not a checkpoint (no {ckpt.WEIGHTS})")
        return path
    best = ckpt.read_best(out) if which == "best" else None
    if best is not None and (out / best.checkpoint / ckpt.WEIGHTS).exists():
        return out / best.checkpoint
    last = ckpt.latest(out)
    if last is None:
        raise EvaluateError(f"{out}: no checkpoint yet; run `fleetdeck-train train` first")
    return last


def load_drafter(path: Path, device: torch.device) -> DFlashDrafter:
    try:
        config = Qwen3Config.from_json_file(str(path / "config.json"))
    except (OSError, ValueError) as exc:
        raise EvaluateError(f"{path / 'config.json'}: cannot read: {exc}") from None
    if not hasattr(config, "dflash_config"):
        raise EvaluateError(f"{path / 'config.json'}: no dflash_config: not a DFlash drafter")
    drafter = DFlashDrafter(config)
    ckpt.load_weights(path, drafter)
    return drafter.to(device).eval()


def stop_tokens(target: Any, tokenizer: Any) -> set[int]:
    stop: set[int] = set()
    for source in (getattr(target, "generation_config", None), target.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            stop.add(eos)
        elif isinstance(eos, list):
            stop.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        stop.add(int(tokenizer.eos_token_id))
    return stop


def evaluate(spec: RunSpec, cfg: TrainSection, which: str = "best", prompts: int | None = None,
             max_new: int | None = None, zero_context: bool = False,
             tie_margin: float | None = None) -> EvalReport:
    from transformers import AutoTokenizer

    paths = resolve(spec, cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype(cfg.dtype, device)
    # bf16 logits round coarsely; batched and one-token forwards may then disagree on
    # near ties that fp32 would separate.
    margin = tie_margin if tie_margin is not None else (
        0.1 if dtype == torch.bfloat16 else 1e-3)
    path = choose_checkpoint(paths.output, which)
    held = ShardSet(paths.prepared, "heldout")
    n = min(prompts or cfg.eval_prompts, len(held))
    if n == 0:
        raise EvaluateError(f"{paths.prepared}: no held-out samples; set [train] "
                            "heldout_share above 0 and prepare again")
    target = load_target(paths.target, dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(paths.tokenizer)
    drafter = load_drafter(path, device)
    stop = stop_tokens(target, tokenizer)
    limit = max_new or cfg.eval_max_new_tokens
    results: list[PromptResult] = []
    forwards = tokens = 0
    spec_s = greedy_s = 0.0
    greedy_tokens = 0
    for i in range(n):
        row = held.row(i)
        prompt = torch.as_tensor(row.input_ids[: row.prompt_len], device=device)[None]
        t0 = time.perf_counter()
        got = speculative(target, drafter, prompt, limit, stop, zero_context)
        t1 = time.perf_counter()
        ref = greedy(target, prompt, limit, stop)
        t2 = time.perf_counter()
        spec_s += t1 - t0
        greedy_s += t2 - t1
        greedy_tokens += len(ref.tokens)
        c = compare(got, ref, margin)
        forwards += len(got.per_forward)
        tokens += sum(got.per_forward)
        results.append(PromptResult(row.index, row.prompt_len, len(got.tokens), got.tau,
                                    c.equal, c.near_tie, c.first_difference))
    spec_rate = sum(r.tokens for r in results) / spec_s if spec_s else 0.0
    greedy_rate = greedy_tokens / greedy_s if greedy_s else 0.0
    return EvalReport(
        checkpoint=str(path), prompts=n, tau=tokens / forwards if forwards else 0.0,
        tokens=tokens, target_forwards=forwards, equal=sum(r.equal for r in results),
        near_ties=sum((not r.equal) and r.near_tie for r in results),
        mismatches=sum((not r.equal) and not r.near_tie for r in results),
        zero_context=zero_context, tie_margin=margin,
        speculative_tokens_per_s=spec_rate, greedy_tokens_per_s=greedy_rate,
        speedup=spec_rate / greedy_rate if greedy_rate else 0.0, results=results)
