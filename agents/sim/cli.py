"""`fleetdeck-agent sim-server`: the SGLang simulator's command line. It takes the common
`sglang.launch_server` flags too, so launch templates written for SGLang start it unchanged."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from agents.sim import logs
from agents.sim.config import SimConfig
from agents.sim.faults import Faults
from agents.sim.logs import log
from agents.sim.settings import SimSettings
from agents.sim.versions import DEFAULT_VERSION, release

BIND_SHARE = 0.75  # SGLang opens its port after the weights load, then warms up (503)


def _version(text: str) -> str:
    try:
        release(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a share in [0, 1]")
    return value


def _configure(p: argparse.ArgumentParser) -> None:
    sg = p.add_argument_group("SGLang server flags (as sglang.launch_server takes them)")
    sg.add_argument("--host", default="127.0.0.1")
    sg.add_argument("--port", type=int, default=30000)
    sg.add_argument("--model-path", "--model", dest="model_path", default="Qwen/Qwen3-8B")
    sg.add_argument("--tokenizer-path", default=None)
    sg.add_argument("--served-model-name", default=None)
    sg.add_argument("--api-key", default=None)
    sg.add_argument("--admin-api-key", default=None)
    sg.add_argument("--enable-metrics", action="store_true")
    sg.add_argument("--enable-cache-report", action="store_true")
    sg.add_argument("--max-running-requests", type=int, default=None,
                    help="running-batch cap; default 48, as SGLang sets under EAGLE/NEXTN")
    sg.add_argument("--max-total-tokens", type=int, default=None, metavar="N",
                    help="the KV pool in tokens (each DP rank's); given, it is enforced as "
                    "SGLang does: admission by KV room as well as by request count, queueing "
                    "beyond it, retraction when decoding runs out (see agents/sim/kvpool.py). "
                    "Not given: 500,000 reported and no KV limit")
    sg.add_argument("--max-queued-requests", type=int, default=None, metavar="N",
                    help="refuse a request arriving while N wait (503, 'The request queue is "
                    "full.'); unlimited by default, as in SGLang")
    sg.add_argument("--context-length", type=int, default=40960)
    sg.add_argument("--reasoning-parser", default="qwen3",
                    help="qwen3 (default here) splits <think>; 'none' returns raw text")
    sg.add_argument("--tool-call-parser", default=None)
    sg.add_argument("--speculative-algorithm", default=None)
    sg.add_argument("--speculative-draft-model-path", default=None)
    sg.add_argument("--speculative-num-steps", type=int, default=3)
    sg.add_argument("--speculative-eagle-topk", type=int, default=1)
    sg.add_argument("--speculative-num-draft-tokens", type=int, default=4)
    sg.add_argument("--speculative-adaptive", action="store_true")
    sg.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    sg.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1,
                    help="DP ranks: each logs its own batch lines and has its own "
                         "internal_states entry and /metrics series")
    sg.add_argument("--enable-dp-attention", action="store_true",
                    help="the DP ranks split one TP group (DP d logs as TP d*tp/dp)")
    sg.add_argument("--load-balance-method", default="round_robin")
    sg.add_argument("--mem-fraction-static", type=float, default=None)
    sg.add_argument("--chunked-prefill-size", type=int, default=8192)
    sg.add_argument("--page-size", type=int, default=1)
    sg.add_argument("--dtype", default="auto")
    sg.add_argument("--kv-cache-dtype", default="auto")
    sg.add_argument("--attention-backend", default=None)
    sg.add_argument("--cuda-graph-max-bs", type=int, default=None)
    sg.add_argument("--disable-radix-cache", action="store_true")
    sg.add_argument("--log-level", default="info")
    sg.add_argument("--decode-log-interval", type=int, default=40,
                    help="accepted for SGLang templates; the simulator uses "
                         "--decode-log-interval-s")
    sg.add_argument("--trust-remote-code", action="store_true")
    sg.add_argument("--random-seed", type=int, default=None)
    sg.add_argument("--watchdog-timeout", type=float, default=300)

    sim = p.add_argument_group("simulator")
    sim.add_argument("--accept-length", type=float, default=3.0,
                     help="mean accept length; 0 turns speculative decoding off")
    sim.add_argument("--time-scale", type=float, default=1.0,
                     help="wall seconds per simulated second (0.001 = 1000x faster)")
    sim.add_argument("--no-delay", action="store_true", help="answer at once (time scale 0)")
    sim.add_argument("--load-seconds", type=float, default=2.0,
                     help="simulated start-up: port closed for 3/4, then 503 until ready")
    sim.add_argument("--warmup-seconds", type=float, default=None, metavar="S",
                     help="instead of the last 1/4: the port opens S simulated seconds before "
                     "ready, /health answering 503 meanwhile (a real 0.5.23 on a CPU: about "
                     "1 s of a 50-160 s start)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--answer-median", type=float, default=1350.0, metavar="TOKENS",
                     help="median natural answer length; each prompt's own length is a "
                          "function of the prompt and --seed (default: as the reference run, "
                          "~18%% truncated at max_tokens 4096, 1,814 tokens on average)")
    sim.add_argument("--answer-spread", type=float, default=1.21, metavar="SIGMA",
                     help="spread of natural answer lengths (sigma of their log)")
    sim.add_argument("--truncation-share", type=_share, default=None,
                     help="instead of --answer-median: the share of answers longer than "
                          "4,096 tokens (fewer are cut at a higher max_tokens)")
    sim.add_argument("--loop-share", type=_share, default=None,
                     help="this share of prompts loop: they repeat a short phrase up to "
                          "max_tokens at any limit (a thinking model's repetition loop)")
    sim.add_argument("--tool-call-share", type=_share, default=0.5)
    sim.add_argument("--peak-tokens-per-s", type=float, default=250.0,
                     help="simulated decode speed of one request alone")
    sim.add_argument("--knee", type=float, default=16.0)
    sim.add_argument("--best-concurrency", type=float, default=40.0)
    sim.add_argument("--hybrid-log", action="store_true",
                     help="Qwen3.5/3.6 hybrid decode log lines (full token / mamba)")
    sim.add_argument("--sglang-version", type=_version, default=DEFAULT_VERSION,
                     metavar="X.Y.Z", help="play this SGLang release: its routes (only "
                     "/get_server_info before 0.5.6), server-info body and log line forms")
    sim.add_argument("--decode-log-interval-s", type=float, default=2.0,
                     help="simulated seconds between decode log lines")

    faults = p.add_argument_group("faults (also POST /sim/faults)")
    faults.add_argument("--error-rate", type=_share, default=0.0,
                        help="share answered with an HTTP error (--error-status) and an "
                             "SGLang error body")
    faults.add_argument("--error-status", type=int, default=500, metavar="STATUS",
                        help="the HTTP status of those errors, 400-599 (default 500)")
    faults.add_argument("--hang-rate", type=_share, default=0.0,
                        help="share never answered (until /abort_request or the client "
                             "goes away)")
    faults.add_argument("--crash-after-requests", type=int, default=None, metavar="N",
                        help="exit(1) when generation request N+1 arrives")
    faults.add_argument("--crash-after-seconds", type=float, default=None, metavar="T",
                        help="exit(1) T simulated seconds after start")
    faults.add_argument("--fail-start", default=None, metavar="FILE",
                        help="die while loading: print FILE (a recorded log tail: out of "
                             "memory, a missing model...) as the server's output, exit(1)")
    faults.add_argument("--slow-factor", type=float, default=1.0,
                        help="divide decode and prefill speed by this")
    faults.add_argument("--garbage-rate", type=_share, default=0.0,
                        help="share answered 200 with a body that is not JSON")
    faults.add_argument("--empty-rate", type=_share, default=0.0,
                        help="share answered with content \"\" and no reasoning")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `sim-server` to a parent command's subparsers; run(args) executes it."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sim-server", help="an SGLang-compatible simulated server (no GPU)",
        description=__doc__)
    _configure(p)
    p.set_defaults(func=run)
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agents.sim", description=__doc__)
    _configure(p)
    return p


def build(args: argparse.Namespace) -> tuple[SimConfig, SimSettings]:
    if not 400 <= args.error_status <= 599:
        raise SystemExit(f"--error-status {args.error_status}: an HTTP error status, 400-599")
    faults = Faults(error_rate=args.error_rate, error_status=args.error_status,
                    hang_rate=args.hang_rate,
                    crash_after_requests=args.crash_after_requests,
                    crash_after_seconds=args.crash_after_seconds,
                    slow_factor=args.slow_factor, garbage_rate=args.garbage_rate,
                    empty_rate=args.empty_rate)
    cfg = SimConfig(
        max_running_requests=args.max_running_requests or 48,
        accept_length=args.accept_length, spec_num_steps=args.speculative_num_steps,
        spec_num_draft_tokens=args.speculative_num_draft_tokens,
        time_scale=0.0 if args.no_delay else args.time_scale,
        load_seconds=args.load_seconds, seed=args.seed,
        answer_median=args.answer_median, answer_spread=args.answer_spread,
        truncation_share=args.truncation_share, tool_call_share=args.tool_call_share,
        loop_share=args.loop_share,
        peak_tokens_per_s=args.peak_tokens_per_s, knee=args.knee,
        best_concurrency=args.best_concurrency, context_length=args.context_length,
        max_total_num_tokens=args.max_total_tokens or 500_000,
        kv_limit=args.max_total_tokens is not None,
        max_queued_requests=args.max_queued_requests, dp_size=max(1, args.dp_size),
        faults=faults)
    algorithm = args.speculative_algorithm or ("EAGLE" if cfg.spec else None)
    if algorithm and algorithm.upper() == "NEXTN":
        algorithm = "EAGLE"  # SGLang rewrites NEXTN to EAGLE
    served = args.served_model_name or args.model_path
    server_args: dict[str, Any] = {
        "model_path": args.model_path, "tokenizer_path": args.tokenizer_path or args.model_path,
        "served_model_name": served, "host": args.host, "port": args.port,
        "api_key": None, "admin_api_key": None,  # never echoed back
        "tp_size": args.tp_size, "dp_size": args.dp_size, "pp_size": 1, "ep_size": 1,
        "enable_dp_attention": args.enable_dp_attention,
        "load_balance_method": args.load_balance_method,
        "mem_fraction_static": args.mem_fraction_static or 0.85,
        "context_length": args.context_length,
        # the CLI value: SGLang resolves it to 48 under EAGLE/NEXTN, else leaves None (and
        # reports what it settled on as effective_max_running_requests_per_dp)
        "max_running_requests": (args.max_running_requests
                                 or (cfg.max_running_requests if cfg.spec else None)),
        "max_total_tokens": args.max_total_tokens,
        "max_queued_requests": args.max_queued_requests,
        "chunked_prefill_size": args.chunked_prefill_size, "page_size": args.page_size,
        "dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype,
        "attention_backend": args.attention_backend,
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "disable_radix_cache": args.disable_radix_cache,
        "reasoning_parser": None if args.reasoning_parser == "none" else args.reasoning_parser,
        "tool_call_parser": args.tool_call_parser,
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": (args.speculative_draft_model_path
                                         or (args.model_path if algorithm else None)),
        "speculative_num_steps": args.speculative_num_steps if algorithm else None,
        "speculative_eagle_topk": args.speculative_eagle_topk if algorithm else None,
        "speculative_num_draft_tokens": (args.speculative_num_draft_tokens
                                         if algorithm else None),
        "speculative_adaptive": args.speculative_adaptive,
        "speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0,
        "pp_max_micro_batch_size": None,
        "enable_metrics": args.enable_metrics, "enable_cache_report": args.enable_cache_report,
        "decode_log_interval": args.decode_log_interval, "log_level": args.log_level,
        "trust_remote_code": args.trust_remote_code,
        "random_seed": args.random_seed if args.random_seed is not None else args.seed,
        "watchdog_timeout": args.watchdog_timeout, "stream_interval": 1,
        "skip_server_warmup": False,
    }
    settings = SimSettings(
        host=args.host, port=args.port, model_path=args.model_path, served_model_name=served,
        api_key=args.api_key, admin_api_key=args.admin_api_key,
        enable_metrics=args.enable_metrics, enable_cache_report=args.enable_cache_report,
        reasoning_parser=server_args["reasoning_parser"], hybrid_log=args.hybrid_log,
        decode_log_interval_s=args.decode_log_interval_s, tp_size=args.tp_size,
        dp_size=args.dp_size, dp_attention=args.enable_dp_attention,
        sglang_version=args.sglang_version, launch_command=shlex.join(sys.argv),
        server_args=server_args)
    logs.DATE_FORMAT = settings.shape.date_format
    return cfg, settings


async def _serve(args: argparse.Namespace) -> int:
    # Here, not at the top: every `fleetdeck-agent` verb builds this parser, and FastAPI
    # and uvicorn cost 0.4 s to import.
    import uvicorn

    from agents.sim.model import SimModel
    from agents.sim.server import SimServer, create_app

    cfg, settings = build(args)
    model = SimModel(cfg)
    tags = settings.scheduler_tags
    log("server_args=ServerArgs(" + ", ".join(
        f"{k}={v!r}" for k, v in settings.server_args.items()) + ")")
    if cfg.spec and args.max_running_requests is None:
        log("Max running requests is reset to 48 for speculative decoding. You can override "
            "this by explicitly setting --max-running-requests.")
    warmup = (cfg.load_seconds * (1 - BIND_SHARE) if args.warmup_seconds is None
              else args.warmup_seconds)
    closed = max(0.0, cfg.load_seconds - warmup)
    log("Load weight begin. avail mem=139.80 GB", tags)
    await asyncio.sleep(closed * cfg.time_scale)
    if args.fail_start:
        sys.stdout.write(Path(args.fail_start).read_text(errors="replace"))
        sys.stdout.flush()
        return 1
    log(f"Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=85.12 GB, "
        f"mem usage=54.68 GB. (simulated: {settings.model_path})", tags)
    log(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {cfg.max_total_num_tokens}, "
        "K size: 32.75 GB, V size: 32.75 GB", tags)
    log(f"max_total_num_tokens={cfg.max_total_num_tokens}, chunked_prefill_size="
        f"{args.chunked_prefill_size}, max_prefill_tokens=16384, max_running_requests="
        f"{cfg.max_running_requests}, context_len={cfg.context_length}, "
        "available_gpu_mem=18.22 GB", tags)
    sim = SimServer(model, settings, warmup_s=warmup * cfg.time_scale)
    config = uvicorn.Config(create_app(sim), host=settings.host, port=settings.port,
                            log_level="warning", access_log=False, lifespan="on",
                            backlog=2048, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    await server.serve()
    return 0 if server.started else 1


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
