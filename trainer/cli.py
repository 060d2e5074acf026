"""`fleetdeck-train`: prepare data, train a DFlash drafter, evaluate it (docs/trainer.md).

    fleetdeck-train prepare RUN.toml [--data SRC] [--endpoint-url URL] ...
    fleetdeck-train train RUN.toml [--resume] [--steps N] [--allow-unfit]
    fleetdeck-train plan RUN.toml [--gpus N] [--gpu-mem GiB] [--sharded]
    fleetdeck-train evaluate RUN.toml [--checkpoint best|latest|DIR] [--zero-context]
    fleetdeck-train export RUN.toml [--checkpoint best|latest|DIR] [--to DIR]

Exit codes: 0 ok; 1 a check failed (the quality gate, a run the memory plan says does not
fit, outputs that differ from greedy decoding); 2 a usage or input error (the message names
the file and the key); 3 another node of a run across nodes was lost (`resume` on every
node goes on).
Data (reports) go to stdout as JSON, narration to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import msgspec

from agents import __version__
from agents.rundir.spec import SpecError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetdeck-train", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"fleetdeck-train {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="completion batches -> token shards + quality gate")
    p.add_argument("spec", help="run.toml with a [train] section")
    p.add_argument("--data", help="batch folder or s3://bucket/prefix (default [train] data)")
    p.add_argument("--endpoint-url", help="S3 endpoint (default [train] endpoint_url)")
    p.add_argument("--out", help="shard folder (default [train] prepared, in the run dir)")
    p.add_argument("--supervise", choices=["final", "all"],
                   help="assistant turns with loss (default [train] supervise: final)")
    p.add_argument("--keep-truncated", action="store_true", default=None,
                   help="keep answers cut by max_tokens (finish_reason length)")
    p.add_argument("--max-under-min-share", type=float,
                   help="gate: most samples allowed under 2 x block size supervised tokens")
    p.add_argument("--max-length", type=int,
                   help="tokens per sample; set, the gate lets its cut through (default "
                   "[train] max_length, else 3072 and at most max_cut_share cut)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes that render and tokenise (default 1)")

    t = sub.add_parser("train", help="train the drafter online against the frozen target")
    t.add_argument("spec")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    t.add_argument("--steps", type=int,
                   help="stop (with a checkpoint) after this many steps of this invocation")
    t.add_argument("--max-steps", type=int, help="cap the run's total steps")
    t.add_argument("--allow-unfit", action="store_true",
                   help="train even where the memory plan says the run does not fit")

    m = sub.add_parser("plan", help="memory per rank from the target's config: does it fit?")
    m.add_argument("spec")
    m.add_argument("--gpus", type=int, help="ranks (default [train] nproc x nodes)")
    m.add_argument("--gpu-mem", type=float, metavar="GIB",
                   help="GPU memory per rank in GiB (default [train] gpu_mem_gib, else "
                   "this machine's first GPU)")
    m.add_argument("--sharded", action="store_true",
                   help="the drafter's parameters, gradients and optimizer sharded (FSDP)")
    m.add_argument("--json", action="store_true", help="also the plan as JSON on stdout")

    e = sub.add_parser("evaluate", help="speculative decoding on held-out prompts: tau")
    e.add_argument("spec")
    e.add_argument("--checkpoint", default="best",
                   help="best (default), latest (or last), or a checkpoint folder")
    e.add_argument("--prompts", type=int, help="held-out prompts (default [train] eval_prompts)")
    e.add_argument("--max-new-tokens", type=int)
    e.add_argument("--zero-context", action="store_true",
                   help="ablation: zero the target features the drafter sees")
    e.add_argument("--tie-margin", type=float,
                   help="logit gap under which a difference from greedy is a near tie")
    e.add_argument("--report", help="also write the report to this file")

    x = sub.add_parser("export", help="the bfloat16 folder SGLang serves as the DFLASH draft")
    x.add_argument("spec")
    x.add_argument("--checkpoint", default="best",
                   help="best (default), latest (or last), or a checkpoint folder")
    x.add_argument("--to", help="destination folder (default RUN_DIR/export, which pull takes)")
    return parser


def _dump(obj: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n")
    sys.stdout.flush()


def _prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agents.rundir.spec import DEFAULT_MAX_LENGTH
    from trainer.paths import load_train_spec, resolve
    from trainer.prepare import PrepareSettings, prepare

    spec, cfg = load_train_spec(args.spec)
    paths = resolve(spec, cfg)
    data = args.data or paths.data
    max_length = cfg.max_length if args.max_length is None else args.max_length
    if max_length is not None and max_length < 1:
        raise SpecError(f"--max-length: must be at least 1, got {max_length}")
    settings = PrepareSettings(
        data=data, tokenizer=paths.tokenizer,
        out=Path(args.out) if args.out else paths.prepared,
        endpoint_url=args.endpoint_url or cfg.endpoint_url,
        supervise=args.supervise or cfg.supervise,
        keep_truncated=cfg.keep_truncated if args.keep_truncated is None else True,
        max_length=DEFAULT_MAX_LENGTH if max_length is None else max_length,
        max_length_explicit=max_length is not None,
        max_cut_share=cfg.max_cut_share, block_size=cfg.block_size,
        max_under_min_share=(cfg.max_under_min_share if args.max_under_min_share is None
                             else args.max_under_min_share),
        heldout_share=cfg.heldout_share, workers=max(1, args.workers))
    report = prepare(settings)
    _dump(report)
    if not report.gate.passed:
        print(f"fleetdeck-train prepare: refused: {report.gate.reason}", file=sys.stderr)
        return 1
    print(f"fleetdeck-train prepare: {report.train_samples} train and {report.heldout_samples} "
          f"held-out samples in {settings.out}", file=sys.stderr)
    return 0


def _become_torchrun(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """`[train] nproc` or `nodes` > 1 outside torchrun: become torchrun, running this same
    command in each process (one node, or this node's part of a run across nodes). Before
    torch is imported: torchrun and its workers import it."""
    from trainer.launch import torchrun_command, under_torchrun
    from trainer.paths import load_train_spec

    spec, cfg = load_train_spec(args.spec)
    if (cfg.nproc > 1 or cfg.nodes > 1) and not under_torchrun():
        os.execv(sys.executable, torchrun_command(
            list(argv), cfg.nproc, cfg.nodes, cfg.node_rank, cfg.rdzv_endpoint,
            spec.run.name, cfg.join_timeout_s, cfg.node_timeout_s))


def _train(args: argparse.Namespace) -> int:
    from trainer.paths import load_train_spec
    from trainer.train import TrainOptions, train

    spec, cfg = load_train_spec(args.spec)
    for flag, value in (("--steps", args.steps), ("--max-steps", args.max_steps)):
        if value is not None and value < 1:
            raise SpecError(f"{flag}: must be at least 1, got {value}")
    status = train(spec, cfg, TrainOptions(args.resume, args.steps, args.max_steps,
                                            args.allow_unfit))
    return 0 if status in ("done", "stopped") else 1


def _plan(args: argparse.Namespace) -> int:
    from trainer.memplan import plan_run
    from trainer.paths import load_train_spec

    spec, cfg = load_train_spec(args.spec)
    for flag, value in (("--gpus", args.gpus), ("--gpu-mem", args.gpu_mem)):
        if value is not None and value <= 0:
            raise SpecError(f"{flag}: must be positive, got {value}")
    p = plan_run(spec, cfg, args.gpus, args.gpu_mem, args.sharded)
    if args.json:
        _dump({"peak_bytes": p.peak, "reserve_bytes": p.reserve, "capacity_bytes":
               p.inputs.capacity, "fits": p.fits, "needs_sharding": p.needs_sharding,
               "rows": [{"name": r.name, "bytes": r.bytes, "how": r.how} for r in p.rows]})
    print(p.table(), file=sys.stdout if not args.json else sys.stderr)
    if p.fits is None:
        print("fleetdeck-train plan: GPU memory unknown: pass --gpu-mem GiB", file=sys.stderr)
        return 2
    return 0 if p.fits else 1


def _evaluate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agents.rundir.atomic import atomic_write
    from trainer.evaluate import evaluate
    from trainer.paths import load_train_spec

    spec, cfg = load_train_spec(args.spec)
    report = evaluate(spec, cfg, args.checkpoint, args.prompts, args.max_new_tokens,
                      args.zero_context, args.tie_margin)
    _dump(report)
    if args.report:
        atomic_write(Path(args.report), msgspec.json.encode(report))
    print(f"fleetdeck-train evaluate: tau {report.tau:.2f} over {report.prompts} prompts; "
          f"{report.equal} equal to greedy, {report.near_ties} near ties, "
          f"{report.mismatches} mismatches", file=sys.stderr)
    return 1 if report.mismatches else 0


def _export(args: argparse.Namespace) -> int:
    from trainer.export import export
    from trainer.paths import load_train_spec

    spec, cfg = load_train_spec(args.spec)
    report = export(spec, cfg, args.checkpoint, args.to)
    _dump(report)
    tau = f"tau {report.tau:.2f}" if report.tau is not None else "tau not measured yet"
    print(f"fleetdeck-train export: {report.checkpoint} -> {report.out} ({tau}); serve with: "
          + " ".join(report.sglang_args), file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    # The first process of each node narrates (with several nodes, each node its own log).
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    logging.basicConfig(level=logging.INFO if local_rank == 0 else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if args.command == "train":
        try:
            _become_torchrun(args, argv)
        except SpecError as exc:
            print(f"fleetdeck-train train: {exc}", file=sys.stderr)
            return 2
    from trainer.checkpoint import CheckpointError
    from trainer.contract import ContractError
    from trainer.data import DataError
    from trainer.distributed import NodesError
    from trainer.evaluate import EvaluateError
    from trainer.export import ExportError
    from trainer.memplan import MemoryPlanError
    from trainer.prepare import PrepareError
    from trainer.shards import ShardError
    from trainer.sources import SourceError
    from trainer.target import TargetError
    from trainer.train import GateRefused, TrainInputError

    try:
        if args.command == "prepare":
            return _prepare(args)
        if args.command == "train":
            return _train(args)
        if args.command == "export":
            return _export(args)
        if args.command == "plan":
            return _plan(args)
        return _evaluate(args)
    except GateRefused as exc:
        print(f"fleetdeck-train {args.command}: refused: {exc}", file=sys.stderr)
        return 1
    except (SpecError, SourceError, PrepareError, TargetError, TrainInputError, DataError,
            ShardError, CheckpointError, EvaluateError, ContractError, ExportError,
            NodesError, MemoryPlanError) as exc:
        print(f"fleetdeck-train {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
