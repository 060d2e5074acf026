"""`fleetdeck-train evaluate`: real speculative decoding on held-out prompts.

The prompts are the held-out samples' own prompts (the tokens before the generated turn).
For each: speculative decoding with the checkpoint's drafter, and the target's plain greedy
decoding; tau, tokens/s of both, and whether the outputs are equal (a difference is allowed
only where the target's two top logits were nearly tied; those are counted). The checkpoint
is checked against the target's config first (exit 2 naming the problem), and the report is
kept beside it as `evaluation.json`, where `export` finds the tau.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from agents.rundir.atomic import atomic_write
from agents.rundir.spec import RunSpec, TrainSection
from trainer import checkpoint as ckpt
from trainer.paths import resolve
from trainer.shards import ShardSet
from trainer.speculative import compare, greedy, speculative
from trainer.target import load_target, target_facts
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
    path = ckpt.choose(paths.output, which)
    # The checkpoint is checked against the target's config before anything heavy loads.
    drafter = ckpt.load_drafter(path, target_facts(paths.target), device)
    held = ShardSet(paths.prepared, "heldout")
    n = min(prompts or cfg.eval_prompts, len(held))
    if n == 0:
        raise EvaluateError(f"{paths.prepared}: no held-out samples; set [train] "
                            "heldout_share above 0 and prepare again")
    target = load_target(paths.target, dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(paths.tokenizer)
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
    report = EvalReport(
        checkpoint=str(path), prompts=n, tau=tokens / forwards if forwards else 0.0,
        tokens=tokens, target_forwards=forwards, equal=sum(r.equal for r in results),
        near_ties=sum((not r.equal) and r.near_tie for r in results),
        mismatches=sum((not r.equal) and not r.near_tie for r in results),
        zero_context=zero_context, tie_margin=margin,
        speculative_tokens_per_s=spec_rate, greedy_tokens_per_s=greedy_rate,
        speedup=spec_rate / greedy_rate if greedy_rate else 0.0, results=results)
    record(path, report)
    return report


def record(path: Path, report: EvalReport) -> None:
    """Keep the measured tau with the checkpoint (export's README quotes it); the ablation
    is kept apart so that it never passes for the drafter's tau."""
    name = ckpt.EVALUATION if not report.zero_context else "evaluation.zero_context.json"
    try:
        atomic_write(path / name, msgspec.json.encode(report))
    except OSError as exc:
        log.warning("%s: cannot keep the evaluation beside the checkpoint: %s", path, exc)


def read_evaluation(path: Path) -> EvalReport | None:
    try:
        return msgspec.json.decode((path / ckpt.EVALUATION).read_bytes(), type=EvalReport)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
