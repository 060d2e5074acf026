"""`fleetdeck-train train`: the DFlash drafter trained online against the frozen target.

Each step the target runs on the batch under inference mode and gives the hidden states of
the chosen layers (nothing goes to disk); anchors are drawn again among answer positions;
the drafter's blocks are scored with the decayed loss. AdamW, cosine schedule with warmup,
gradient clipping and accumulation; under torchrun the drafter is replicated (DDP) or
sharded (FSDP2, trainer/sharding.py). A step reads the next global batch of the epoch's order
(trainer/data.py), and a sample's anchors come from a generator seeded by (seed, epoch,
sample), so `--resume` continues exactly as if the run had not stopped, also on another
number of processes (grad_accum keeps the global batch; checkpoints load through
torch.distributed.checkpoint into any layout).

Across nodes (`[train] nodes`) node rank 0 leads: it alone writes checkpoints and the run's
progress, and on `--resume` decides from its checkpoints and sends the one it resumes from to
the others; a lost node stops every node within `[train] node_timeout_s`
(trainer/nodewatch.py), and `resume` on every node goes on from that checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import nn

from agents.ewma import EwmaRate
from agents.rundir.spec import RunSpec, TrainSection
from trainer import checkpoint as ckpt
from trainer import distributed, sharding
from trainer.blocks import (
    ANCHOR_RULES,
    AnchorRule,
    Anchors,
    default_gamma,
    position_weights,
    sample_anchors,
)
from trainer.contract import DFlashSettings, drafter_config
from trainer.data import DataError, StepPlan, accumulation, load_batch
from trainer.distributed import Dist, NodesError
from trainer.drafter import DFlashDraftModel
from trainer.nodewatch import LOST_EXIT, NodeWatch, short_error
from trainer.objective import Batch, BlockStats, attention_for, block_loss
from trainer.paths import TrainPaths, resolve
from trainer.progress import ProgressWriter
from trainer.report import REPORT_NAME, report_decoder
from trainer.shards import ShardSet
from trainer.target import (
    choose_mask_token,
    embeddings,
    features,
    layer_ids,
    lm_head,
    load_target,
    target_config,
)

log = logging.getLogger("fleetdeck.train")


class TrainInputError(ValueError):
    """Inputs that cannot start a run (exit 2)."""


class GateRefused(RuntimeError):
    """The prepared data set failed the quality gate, or the run does not fit the GPUs'
    memory (exit 1)."""


RESUME_HINT = "the job stops; `resume` on every node goes on from rank 0's last checkpoint"


@dataclass
class Offer:
    """What a run resumes from, as node rank 0 found it (sent to every process when there
    are several nodes, with the checkpoint's files, which only node 0 has)."""

    refusal: str | None = None
    note: str | None = None
    folder: str | None = None
    weights: bytes | None = None
    state: bytes | None = None
    # distcp/'s files (a checkpoint from before distcp has none: `weights`, then).
    resume: dict[str, bytes] | None = None


@dataclass(frozen=True)
class TrainOptions:
    resume: bool = False
    # Steps to run in this invocation before checkpointing and stopping (then --resume).
    steps: int | None = None
    max_steps: int | None = None
    # Train even where the memory plan says the run does not fit.
    allow_unfit: bool = False


def warmup_cosine(total: int, warmup_ratio: float) -> Callable[[int], float]:
    warm = max(1, round(total * warmup_ratio)) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total - warm))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def anchor_rule(cfg: TrainSection) -> AnchorRule:
    """`[train] anchor_rule` ("supervised_next", the default, or "whole_block": the old rule,
    room for a whole block after the anchor)."""
    rule = cfg.anchor_rule
    if rule not in ANCHOR_RULES:
        raise TrainInputError(f"[train] anchor_rule: {rule!r}, expected one of "
                              + ", ".join(ANCHOR_RULES))
    return rule


def anchor_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)


# Compiled flex attention sees few shapes: sequences padded to a multiple of this, anchors
# per sequence to a power of two (a recompile is not a step's cost: across nodes a step with
# a shape new to some rank waits trainer/distributed.py's start-up allowance).
SEQ_BUCKET = 256


def bucket_anchors(n: int, most: int) -> int:
    """The anchor slots for `n` anchors: the next power of two, or `most` (at least n)."""
    return max(n, min(most, 1 << max(0, n - 1).bit_length()))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    if device.type == "cuda" and dtype == torch.bfloat16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[bool]]:
    """SIGTERM/SIGINT ask for a stop at the end of the current step (after a checkpoint)."""
    flag = [False]

    def handler(signum: int, frame: FrameType | None) -> None:
        flag[0] = True

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Trainer:
    """One training run on one rank; `run()` returns the final status."""

    def __init__(self, spec: RunSpec, cfg: TrainSection, opts: TrainOptions, d: Dist) -> None:
        self.spec, self.cfg, self.opts, self.d = spec, cfg, opts, d
        self.paths: TrainPaths = resolve(spec, cfg)
        self.device = d.device
        self.dtype = resolve_dtype(cfg.dtype, d.device)
        self._check_prepared()
        plan_shards = self._check_memory()
        self.train_set = ShardSet(self.paths.prepared, "train")
        self.heldout = ShardSet(self.paths.prepared, "heldout")
        self._agree_on_data()
        config = target_config(self.paths.target)
        ids = layer_ids(config, cfg.target_layer_ids, cfg.target_features)
        # Lean: no layer past the deepest feature layer is loaded or run.
        self.target = load_target(self.paths.target, self.dtype, self.device,
                                  keep_layers=max(ids) + 1)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.paths.tokenizer)
        rows = int(self.target.get_input_embeddings().weight.shape[0])
        self.settings = DFlashSettings(
            cfg.block_size, choose_mask_token(cfg.mask_token_id, tok, rows), ids)
        self.drafter_cfg = drafter_config(config, cfg.drafter_layers, self.settings)
        self.anchor_rule = anchor_rule(cfg)
        self.attention = attention_for(self.device)
        self.seq_bucket = SEQ_BUCKET if self.attention == "flex" else 1
        torch.manual_seed(cfg.seed)
        self.drafter = DFlashDraftModel(self.drafter_cfg).float().to(self.device)
        self.embed, self.head = embeddings(self.target), lm_head(self.target)
        self.weights = position_weights(cfg.block_size,
                                        cfg.gamma or default_gamma(cfg.block_size))
        offer = self._find_resume()
        state = ckpt.load_state(Path(offer.folder), offer.state) if offer.folder else None
        self.plan = StepPlan(len(self.train_set), d.world, d.rank, cfg.batch_size,
                             self._accumulation(offer, state), cfg.epochs, cfg.seed,
                             opts.max_steps or cfg.max_steps)
        try:
            params = sum(p.numel() for p in self.drafter.parameters())
            self.sharded = sharding.decide(cfg.shard, params, d) or (
                plan_shards and cfg.shard == "auto")
        except sharding.ShardError as exc:
            raise TrainInputError(str(exc)) from None
        if self.sharded:
            sharding.shard(self.drafter, d, self.dtype)
            log.info("drafter sharded over %d processes (FSDP2, [train] shard = %s)", d.world,
                     cfg.shard)
        self.opt = torch.optim.AdamW(self.drafter.parameters(), lr=cfg.lr,
                                     weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, warmup_cosine(self.plan.total_steps, cfg.warmup_ratio))
        self.step = 0
        self.last_ckpt: str | None = None
        if offer.folder is not None and state is not None:
            self._resume(offer, state)
        self.model: nn.Module = (self.drafter if self.sharded
                                 else sharding.replicate(self.drafter, d))
        # Every node's first process keeps its node's progress.json; node 0's is the run's.
        self.following = (None if d.main
                          else f"rank {d.node_rank} of {d.nodes}, following rank 0")
        self.progress = (ProgressWriter(self.paths.progress, spec.run.name,
                                        self.plan.total_steps, cfg.epochs, d.world,
                                        node_rank=d.node_rank, nodes=d.nodes)
                         if d.node_main else None)
        # One node waits join_timeout_s; several, the first steps, checkpoints and steps with a
        # shape new to a rank (a recompile) too, the others at most node_timeout_s.
        self.allowance = distributed.Allowance(d, cfg.join_timeout_s, cfg.node_timeout_s,
                                               cfg.startup_steps, self.attention == "flex")
        self.watch: NodeWatch | None = None
        if d.nodes > 1 and d.node_main and cfg.rdzv_endpoint is not None:
            self.watch = NodeWatch(d, cfg.rdzv_endpoint, spec.run.name, cfg.node_timeout_s,
                                   self._lost)

    # -- set-up --------------------------------------------------------------------------

    def _check_prepared(self) -> None:
        path = self.paths.prepared / REPORT_NAME
        try:
            report = report_decoder.decode(path.read_bytes())
        except FileNotFoundError:
            raise TrainInputError(f"{path}: missing; run `fleetdeck-train prepare` first") \
                from None
        except Exception as exc:  # msgspec decode and validation errors
            raise TrainInputError(f"{path}: unreadable: {exc}") from None
        if not report.gate.passed:
            raise GateRefused(f"{path}: the data set failed the quality gate: "
                              f"{report.gate.reason}")
        if report.block_size != self.cfg.block_size:
            raise TrainInputError(
                f"{path}: prepared for block_size {report.block_size}, but [train] "
                f"block_size is {self.cfg.block_size}; run prepare again")

    def _check_memory(self) -> bool:
        """Refuse, with the plan's table, a run whose peak per rank exceeds the GPU's memory
        (trainer/memplan.py); nothing to judge on the CPU unless [train] gpu_mem_gib. True
        when the plan finds that only the sharded layout fits: `shard = "auto"` then shards
        (and is judged sharded)."""
        from trainer.memplan import MemoryPlanError, plan_run

        sharded = self.cfg.shard == "always" and self.d.enabled
        bf16 = self.dtype == torch.bfloat16
        try:
            fit = plan_run(self.spec, self.cfg, self.d.world, sharded=sharded, bf16=bf16)
            only_sharded = fit.needs_sharding and self.cfg.shard == "auto"
            if only_sharded:
                fit = plan_run(self.spec, self.cfg, self.d.world, sharded=True, bf16=bf16)
        except MemoryPlanError as exc:  # a hub id: no config.json to read before loading
            log.warning("no memory plan: %s", exc)
            return False
        if fit.fits is False:
            if self.opts.allow_unfit or self.cfg.allow_unfit:
                log.warning("the memory plan says this run does not fit; training anyway "
                            "(allow_unfit):\n%s", fit.table())
                return False
            raise GateRefused(f"the run does not fit the GPU's memory (override: "
                              f"[train] allow_unfit or --allow-unfit):\n{fit.table()}")
        if self.d.main:
            log.info("%s", fit.table())
        return only_sharded

    def _agree_on_data(self) -> None:
        """Every node prepared its own shards from the same data: they must be the same size,
        or the nodes would plan different steps and wait for each other forever."""
        if self.d.nodes <= 1:
            return
        sizes = distributed.gather((self.d.node_rank, len(self.train_set), len(self.heldout)),
                                   self.d)
        _, train0, held0 = sizes[self.d.lead]
        for node, n_train, n_held in sizes:
            if (n_train, n_held) != (train0, held0):
                raise NodesError(
                    f"{self.d.describe(node)} prepared {n_train} train and {n_held} held-out "
                    f"samples, rank 0 {train0} and {held0}: every node must prepare the same "
                    "data ([train] data and prepare's settings)")

    def _offer(self, ship: bool) -> Offer:
        """What to resume from, found in this node's checkpoints: the newest that is whole
        (its manifest's sha256 checked), naming the newer ones skipped; `ship`: with the
        files."""
        out = self.paths.output
        named = ckpt.checkpoints(out)
        if not self.opts.resume:
            if named:
                return Offer(refusal=f"{out}: holds checkpoints ({named[-1].name}); pass "
                             "--resume to continue them, or move them away to start over")
            return Offer()
        if not named:
            return Offer(note=f"nothing to resume in {out}: starting from step 0")
        found = ckpt.newest_good(out)
        last = found.path
        if last is None:
            return Offer(refusal=f"{out}: no whole checkpoint to resume from ({found.said()}); "
                         "move them away to start over")
        notes = [found.said()] if found.skipped else []
        if found.unsealed:
            notes.append(f"{last.name} is from before sealed checkpoints (no manifest): "
                         "resumed from unverified")
        note = "; ".join(notes) or None
        if not ship:
            return Offer(folder=str(last), note=note)
        try:
            if (last / ckpt.RESUME).is_dir():
                return Offer(folder=str(last), state=(last / ckpt.STATE).read_bytes(),
                             resume=ckpt.resume_files(last), note=note)
            return Offer(folder=str(last), weights=(last / ckpt.WEIGHTS).read_bytes(),
                         state=(last / ckpt.STATE).read_bytes(), note=note)
        except OSError as exc:
            return Offer(refusal=f"{last}: cannot read: {exc}")

    def _find_resume(self) -> Offer:
        """What this run resumes from (node rank 0 decides for every node), or refused."""
        if self.d.nodes > 1:
            offer = distributed.from_lead(self._offer(ship=True) if self.d.main else None,
                                          self.d)
        else:
            offer = self._offer(ship=False)
        if offer.refusal is not None:
            raise TrainInputError(offer.refusal)
        if offer.note is not None:
            log.log(logging.WARNING if offer.folder else logging.INFO, "%s", offer.note)
        return offer

    def _accumulation(self, offer: Offer, state: dict[str, Any] | None) -> int:
        """grad_accum for this run: the spec's for a new run; on a resume, what keeps the
        checkpoint's global batch on this many processes (refused where nothing does)."""
        cfg = self.cfg
        if state is None:
            return cfg.grad_accum
        world0 = int(state.get("world_size") or 1)
        global_batch = int(state.get("global_batch")
                           or cfg.batch_size * cfg.grad_accum * world0)
        try:
            accum = accumulation(global_batch, cfg.batch_size, self.d.world)
        except DataError as exc:
            raise TrainInputError(f"{offer.folder}: {exc}") from None
        if accum != cfg.grad_accum:
            log.info("%d processes keep the global batch of %d samples (written by %d): "
                     "grad_accum %d, not the spec's %d", self.d.world, global_batch, world0,
                     accum, cfg.grad_accum)
        return accum

    def _resume(self, offer: Offer, state: dict[str, Any]) -> None:
        last = Path(offer.folder or "")
        if state.get("total_steps") != self.plan.total_steps:
            raise TrainInputError(
                f"{last}: planned {state.get('total_steps')} steps, this run plans "
                f"{self.plan.total_steps}: the data or [train] epochs/batch changed")
        if offer.resume is not None and self.d.node_rank != 0:
            # Only node 0 has the checkpoint: load the copy it sent.
            with tempfile.TemporaryDirectory(prefix="fleetdeck-resume-") as tmp:
                for name, data in offer.resume.items():
                    Path(tmp, Path(name).name).write_bytes(data)
                ckpt.load_resume(last, self.drafter, self.opt, Path(tmp))
        elif (last / ckpt.RESUME).is_dir() or offer.resume is not None:
            ckpt.load_resume(last, self.drafter, self.opt)
        else:
            # From before distcp/: weights and an optimizer by parameter index, which only
            # the same replicated layout reads back.
            if state.get("world_size") != self.d.world or self.sharded:
                raise TrainInputError(
                    f"{last}: written before resumable checkpoints (no {ckpt.RESUME}/) by "
                    f"{state.get('world_size')} replicated processes; resume it on as many, "
                    "with [train] shard = \"never\"")
            ckpt.load_weights(last, self.drafter, offer.weights)
            self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        ckpt.restore_rng(state["rng"])
        self.step = int(state["step"])
        samples = int(state.get("samples", self.plan.samples(self.step)))
        if samples != self.plan.samples(self.step):
            raise TrainInputError(f"{last / ckpt.STATE}: {samples} samples consumed at step "
                                  f"{self.step}, not {self.plan.samples(self.step)} (step x "
                                  f"global batch {self.plan.global_batch})")
        self.last_ckpt = last.name
        log.info("resumed from %s at step %d (%d samples consumed, global batch %d = "
                 "batch_size %d x grad_accum %d x %d processes)", last, self.step, samples,
                 self.plan.global_batch, self.plan.batch_size, self.plan.grad_accum,
                 self.d.world)

    def _lost(self, reason: str, cause: str | None = None) -> None:
        """A node is lost (the watch says so while this process waits in a collective, or a
        collective failed and the watch names who went): say so and end the process at once,
        LOST_EXIT (the group cannot be taken down in order; torchrun then ends the node's
        job, non-zero)."""
        message = f"{reason} ({cause}); {RESUME_HINT}" if cause else f"{reason}; {RESUME_HINT}"
        log.error("%s", message)
        if self.progress is not None:
            self.progress.finish("failed", message)
        sys.stderr.flush()
        os._exit(LOST_EXIT)

    # -- one step ------------------------------------------------------------------------

    def _anchors(self, batch: Batch, rows: list[int], salt: list[int]) -> Anchors:
        """Each sample's anchors from a generator of its own, seeded by (seed, salt, sample):
        the same whichever process and micro-batch it falls in."""
        drawn = [sample_anchors(batch.loss_mask[i:i + 1].cpu(), batch.lengths[i:i + 1].cpu(),
                                self.cfg.anchors, self.cfg.block_size,
                                torch.Generator().manual_seed(
                                    anchor_seed(self.cfg.seed, *salt, row)),
                                self.anchor_rule)
                 for i, row in enumerate(rows)]
        n = max(a.positions.shape[1] for a in drawn)
        if self.seq_bucket > 1:
            n = bucket_anchors(n, self.cfg.anchors)
        positions = torch.zeros(len(rows), n, dtype=torch.long)
        valid = torch.zeros(len(rows), n, dtype=torch.bool)
        for i, a in enumerate(drawn):
            positions[i, : a.positions.shape[1]] = a.positions[0]
            valid[i, : a.valid.shape[1]] = a.valid[0]
        return Anchors(positions, valid)

    def _inputs(self, shards: ShardSet, rows: list[int], salt: list[int]
                ) -> tuple[Batch, Anchors]:
        """A micro-batch and its anchors, on the CPU: their shapes are what compiles."""
        batch = load_batch(shards, rows, self.seq_bucket)
        return batch, self._anchors(batch, rows, salt)

    def _batch_stats(self, model: nn.Module, inputs: tuple[Batch, Anchors]
                     ) -> tuple[torch.Tensor, BlockStats]:
        batch, anchors = inputs[0].to(self.device), inputs[1]
        feats = features(self.target, batch.input_ids, batch.attention_mask,
                         self.settings.target_layer_ids)
        with autocast(self.device, self.dtype):
            return block_loss(model, self.embed, self.head, feats, batch, anchors,
                              self.settings.mask_token_id, self.weights, self.attention,
                              self.cfg.loss_chunk)

    def train_step(self) -> BlockStats:
        self.model.train()
        stats = BlockStats(self.cfg.block_size)
        accum = self.plan.grad_accum
        epoch = self.plan.epoch_of(self.step)
        micros = [self._inputs(self.train_set, self.plan.rows(self.step, m), [0, epoch])
                  for m in range(accum)]
        shapes = [(*b.input_ids.shape, *a.positions.shape) for b, a in micros]
        with self.allowance.step(shapes):
            for micro, inputs in enumerate(micros):
                last = micro == accum - 1
                # Replicated, gradients are summed once, after the last micro-batch; sharded,
                # every micro-batch reduce-scatters (only a shard of the gradient is kept).
                sync = (self.model.no_sync()  # type: ignore[operator]
                        if self.d.enabled and not self.sharded and not last
                        else contextlib.nullcontext())
                with sync:
                    loss, s = self._batch_stats(self.model, inputs)
                    (loss / accum).backward()
                stats.add(s)
            torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.cfg.clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            stats.values = distributed.all_sum(stats.values, self.d)
        return stats

    def heldout_stats(self) -> BlockStats | None:
        """Block-prefix accept length on the first `eval_samples` held-out samples, with
        the same anchors every time (seeded by sample) so checkpoints compare."""
        n = min(self.cfg.eval_samples, len(self.heldout))
        if n == 0:
            return None
        self.drafter.eval()
        total = BlockStats(self.cfg.block_size)
        mine = list(range(self.d.rank, n, self.d.world))
        size = self.cfg.batch_size
        # Sharded, every process runs as many forwards (each gathers the weights): one short
        # of samples repeats one and does not count it.
        passes = -(-len(range(0, n, self.d.world)) // size)
        with torch.no_grad():
            for i in range(passes if self.sharded else -(-len(mine) // size)):
                rows = mine[i * size: (i + 1) * size]
                _, s = self._batch_stats(self.drafter,
                                         self._inputs(self.heldout, rows or [0], [1]))
                if rows:
                    total.add(s)
        total.values = distributed.all_sum(total.values, self.d)
        self.drafter.train()
        return total

    # -- checkpoints and progress --------------------------------------------------------

    def checkpoint(self, window: BlockStats) -> None:
        # The held-out pass compiles its own graphs and rank 0 writes: the start-up allowance.
        with self.allowance.generous():
            self._checkpoint(window)

    def _checkpoint(self, window: BlockStats) -> None:
        held = self.heldout_stats()
        full = sharding.full_state(self.drafter, self.opt, self.d, self.sharded)
        epoch = self.plan.epoch_of(self.step - 1)
        metrics = ckpt.Metrics(self.step, epoch, window.loss, window.accept_length,
                               held.accept_length if held else None,
                               held.accuracy if held else [])
        out = self.paths.output
        if self.d.main:
            state = {"step": self.step, "epoch": epoch, "total_steps": self.plan.total_steps,
                     "world_size": self.d.world, "global_batch": self.plan.global_batch,
                     "batch_size": self.plan.batch_size, "grad_accum": self.plan.grad_accum,
                     "samples": self.plan.samples(self.step), "sharded": self.sharded,
                     "scheduler": self.sched.state_dict(), "rng": ckpt.rng_state(),
                     "seed": self.cfg.seed}
            path = ckpt.save(out, epoch, self.step, self.drafter, state, metrics, full)
            ckpt.update_best(out, path, metrics)
            ckpt.prune(out, self.cfg.keep_last, path)
            self.last_ckpt = path.name
            best = ckpt.read_best(out)
            log.info("checkpoint %s: held-out accept length %s", path.name,
                     "n/a" if held is None else f"{held.accept_length:.3f}")
            if self.progress is not None:
                self.progress.update(
                    force=True, last_checkpoint=str(path),
                    best_checkpoint=str(out / best.checkpoint) if best else None,
                    best_accept_length=best.heldout_accept_length if best else None,
                    heldout_accept_length=metrics.heldout_accept_length)
        # The others wait here while rank 0 writes (the watch still catches a lost node).
        distributed.barrier(self.d)

    def run(self) -> str:
        cfg, plan = self.cfg, self.plan
        window = BlockStats(cfg.block_size)
        tokens = EwmaRate(tau_s=30.0)
        step_s: float | None = None
        ran = 0
        status = "done"
        if self.watch is not None:
            self.watch.start()
        if self.progress is not None:
            out = self.paths.output
            best = ckpt.read_best(out) if self.last_ckpt and self.d.main else None
            self.progress.start_heartbeat()
            self.progress.update(
                force=True, status="running", step=self.step,
                epoch=plan.epoch_of(min(self.step, plan.total_steps - 1)),
                last_checkpoint=str(out / self.last_ckpt) if self.last_ckpt and self.d.main
                else None,
                best_checkpoint=str(out / best.checkpoint) if best else None,
                best_accept_length=best.heldout_accept_length if best else None,
                message=self.following)
        last_log = 0.0
        with stop_on_signals() as stop_flag:
            while self.step < plan.total_steps:
                t0 = time.monotonic()
                lr = float(self.sched.get_last_lr()[0])
                stats = self.train_step()
                ran += 1
                self.allowance.after_step(ran)
                # A decayed window: the console sees recent accuracy, not the lifetime mean.
                window.values = window.values * 0.9 + stats.values
                tokens.add(stats.tokens)
                dt = time.monotonic() - t0
                step_s = dt if step_s is None else 0.9 * step_s + 0.1 * dt
                stop = distributed.any_rank(stop_flag[0], self.d)
                budget = self.opts.steps is not None and ran >= self.opts.steps
                done = self.step >= plan.total_steps
                if self.step % cfg.save_every == 0 or done or stop or budget:
                    self.checkpoint(window)
                if self.progress is not None and not self.d.main:
                    # A follower counts the same steps; the figures are rank 0's to show.
                    self.progress.update(
                        status="running", step=self.step, epoch=plan.epoch_of(self.step - 1),
                        steps_per_s=1.0 / step_s if step_s else 0.0,
                        eta_hours=(plan.total_steps - self.step) * step_s / 3600.0)
                elif self.progress is not None:
                    rate = tokens.tick()
                    self.progress.update(
                        status="running", step=self.step, epoch=plan.epoch_of(self.step - 1),
                        loss=window.loss, accuracy=window.accuracy,
                        accept_length=window.accept_length, tokens_per_s=rate, lr=lr,
                        steps_per_s=1.0 / step_s if step_s else 0.0,
                        eta_hours=(plan.total_steps - self.step) * step_s / 3600.0)
                    if time.monotonic() - last_log > 10 or done:
                        last_log = time.monotonic()
                        log.info("step %d/%d loss %.4f accept %.2f tok/s %.0f lr %.2e",
                                 self.step, plan.total_steps, window.loss or float("nan"),
                                 window.accept_length or float("nan"), rate, lr)
                if (stop or budget) and not done:
                    status = "stopped"
                    break
        if self.watch is not None:
            self.watch.stop(done=True)
        if self.progress is not None:
            why = None if status == "done" else f"stopped at step {self.step}; --resume goes on"
            if self.following is not None:
                why = self.following if why is None else f"{self.following}; {why}"
            self.progress.finish("done" if status == "done" else "stopped", why)
        return status


def _refused(spec: RunSpec, cfg: TrainSection, d: Dist, message: str) -> None:
    """Refused before a run ever began (gate, inputs): say why in progress.json. An existing
    one belongs to a run that did begin (maybe still going): a mistaken second `train` must
    not overwrite it."""
    path = resolve(spec, cfg).progress
    if path.exists():
        return
    try:
        ProgressWriter(path, spec.run.name, 0, cfg.epochs, d.world).finish("failed", message)
    except OSError:
        pass


def train(spec: RunSpec, cfg: TrainSection, opts: TrainOptions) -> str:
    d = distributed.init(cfg.nodes, cfg.node_rank, str(spec.run_dir), cfg.join_timeout_s)
    trainer: Trainer | None = None
    try:
        trainer = Trainer(spec, cfg, opts, d)
        status = trainer.run()
        distributed.close(d)  # every rank got here: they leave the group together
        return status
    except BaseException as exc:
        if trainer is not None and trainer.watch is not None and isinstance(exc, RuntimeError):
            # A collective failed: a peer's socket closed, or it waited node_timeout_s.
            reason = trainer.watch.explain()
            if reason is not None:
                trainer._lost(reason, short_error(exc))
        message = f"{type(exc).__name__}: {exc}"
        if trainer is not None and trainer.allowance.steady and "timed out" in message.lower():
            message = (f"{type(exc).__name__}: {short_error(exc)} (a collective waited over "
                       f"[train] node_timeout_s = {cfg.node_timeout_s:g} s after the first "
                       f"{cfg.startup_steps} steps, across nodes: a rank stuck or gone; a "
                       "slow step wants more of either)")
        if trainer is not None and trainer.progress is not None:
            trainer.progress.finish("failed", message)
        elif d.node_main:
            _refused(spec, cfg, d, message)
        # No destroy_process_group here: the others may be in a collective, which it would
        # wait for (torchtitan#1342); the process's exit lets the group go, and torchrun
        # ends the others.
        raise
