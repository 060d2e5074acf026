"""What the SGLang simulator reports about itself: Prometheus `/metrics` text, `/v1/loads`
and `/server_info`, in SGLang 0.5.x's shapes (shared/reference/sglang.md)."""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime
from typing import Any

from fastapi.responses import Response

from agents.sim.kvpool import INIT_RATIO
from agents.sim.model import SimModel
from agents.sim.responses import json_response
from agents.sim.settings import SimSettings
from agents.sim.stats import Histogram

PROM = "text/plain; version=0.0.4; charset=utf-8"


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labelstr(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return "{" + ",".join(f'{k}="{esc(labels[k])}"' for k in sorted(labels)) + "}"


class _Exposition:
    """Prometheus text as prometheus_client's multiprocess collector prints it: sorted
    labels, float values, no `_created` samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: list[tuple[str, dict[str, str], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for sample, labels, value in samples:
            self.lines.append(f"{sample}{_labelstr(labels)} {_fmt(value)}")

    def histogram(self, name: str, help_text: str, hist: Histogram, base: dict[str, str],
                  label: str | None) -> None:
        samples: list[tuple[str, dict[str, str], float]] = []
        for key in sorted(hist.counts):
            labels = dict(base, **({label: key} if label else {}))
            acc = 0
            for bound, count in zip([*hist.bounds, math.inf], hist.counts[key], strict=True):
                acc += count
                samples.append((f"{name}_bucket", dict(labels, le=_fmt(bound)), acc))
            samples.append((f"{name}_count", labels, acc))
            samples.append((f"{name}_sum", labels, hist.sums[key]))
        self.family(name, "histogram", help_text, samples)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _internal_state(model: SimModel, settings: SimSettings, rank: int) -> dict[str, Any]:
    """One DP rank's live state: its own throughput and cumulative accept length."""
    cfg = model.cfg
    v = settings.shape
    dp = len(model.ranks)
    state = dict(settings.server_args)
    if dp > 1:
        last = model.rank_last.get(rank)
        throughput = last.gen_throughput if last is not None else 0.0
        accept = model.ranks[rank].accept_length
    else:
        throughput, accept = model.last.gen_throughput, model.avg_spec_accept_length
    state["last_gen_throughput"] = throughput
    if v.effective_cap:
        state["effective_max_running_requests_per_dp"] = cfg.max_running_requests // dp
    if v.load_field:
        state["load"] = sum(1 for r in model.running if r.dp_rank == rank)
    graph = v.memory_usage_graph_key
    kvcache = round(cfg.max_total_num_tokens * 0.000131, 2)
    if graph is not None and v.graph_phases:  # 0.5.23: graph memory by phase, and more
        state.update(decode_cuda_graph_bs=[], decode_cuda_graph_memory_gb=1.52,
                     world_size=settings.tp_size)
        state["memory_usage"] = {
            "weight": 54.68, "kvcache": kvcache, "startup_available": 139.8,
            "token_capacity": cfg.max_total_num_tokens, "token_capacity_swa": None,
            graph: {"prefill": 0.0, "decode": 1.52, "target_verify": 0.0,
                    "draft_prefill": 0.0, "draft_decode": 0.0, "draft_extend": 0.0}}
    elif graph is not None:
        state["memory_usage"] = {"weight": 54.68, "kvcache": kvcache,
                                 "token_capacity": cfg.max_total_num_tokens, graph: 1.52}
    if cfg.spec and accept is not None:
        state["avg_spec_accept_length"] = accept
    return state


def server_info(model: SimModel, settings: SimSettings) -> dict[str, Any]:
    """`GET /server_info` (or `/get_server_info`): the server args with the live state, in
    the form of the version played: one `internal_states` entry per DP rank, the first
    rank's merged at the top level (0.4.4-0.4.6.post1), or none (up to 0.4.3)."""
    cfg = model.cfg
    v = settings.shape
    body: dict[str, Any] = {**settings.server_args, "launch_command": settings.launch_command,
                            "max_total_num_tokens": cfg.max_total_num_tokens}
    if v.max_req_input_len:
        body["max_req_input_len"] = min(cfg.context_length, cfg.max_total_num_tokens) - 1
    body["version"] = v.version
    form = v.state_form
    if form == "list":
        body["internal_states"] = [_internal_state(model, settings, r)
                                   for r in range(len(model.ranks))]
    elif form == "top_level":
        first = _internal_state(model, settings, 0)
        body.update({k: first[k] for k in ("last_gen_throughput", "avg_spec_accept_length")
                     if k in first})
    return body


def loads(model: SimModel, settings: SimSettings, include: str | None,
          fmt: str | None) -> Response:
    """`GET /v1/loads`: the requested sections, as JSON or as Prometheus gauges."""
    sections = {s.strip() for s in include.split(",")} if include else {"all"}
    valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
    if sections - valid:
        return json_response({"detail": f"Invalid include sections: {sections - valid}. "
                                f"Valid options: {sorted(valid)}"}, 400)
    cfg = model.cfg
    every = "all" in sections
    load: dict[str, Any] = {"timestamp": time.time(), "dp_rank": 0}
    if every or "core" in sections:
        used = model.used_tokens()
        waiting = sum(r.prompt_tokens for r in model.waiting)
        load.update({
            "num_running_reqs": len(model.running), "num_waiting_reqs": len(model.waiting),
            "num_waiting_uncached_tokens": waiting, "num_used_tokens": used,
            "num_total_tokens": used + waiting, "num_active_tokens": used,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": cfg.max_total_num_tokens,
            "max_running_requests": cfg.max_running_requests,
            "token_usage": used / cfg.max_total_num_tokens,
            "gen_throughput": model.last.gen_throughput,
            "cache_hit_rate": model.last.cache_hit_rate,
            "utilization": len(model.running) / cfg.max_running_requests,
            "total_prefill_uncached_tokens": sum(c.new_tokens for c in model.ranks),
            "total_prefill_busy_us": 0,
            # six figures of the decode step times in 0.5.23 (what they are is not read)
            "decode_moments": [0.0] * 6})
    if every or "memory" in sections:
        load["memory"] = {"weight_gb": 54.68, "kv_cache_gb": 65.5, "graph_gb": 1.52,
                          "token_capacity": cfg.max_total_num_tokens}
    if (every or "spec" in sections) and cfg.spec:
        load["speculative"] = {"accept_length": model.last.accept_length,
                               "accept_rate": model.last.accept_rate}
    if every or "disagg" in sections:
        load["disaggregation"] = {
            "mode": "null", "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0, "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}
    if every or "queues" in sections:
        load["queues"] = {"waiting": len(model.waiting), "grammar": 0,
                          "paused": len(model.waiting) if model.paused else 0,
                          "retracted": 0, "prealloc_ready": 0}
    if fmt == "prometheus":
        lines: list[str] = []
        for key, value in load.items():
            if key == "dp_rank":
                continue
            prefix = {"speculative": "spec"}.get(key, key)
            if isinstance(value, list | str):
                continue
            items = ([(f"sglang_{prefix}_{k}", v) for k, v in value.items()
                      if isinstance(v, int | float)]
                     if isinstance(value, dict) else [(f"sglang_{key}", value)])
            for name, v in items:
                lines += [f"# TYPE {name} gauge", f'{name}{{dp_rank="0"}} {v}']
        return Response("\n".join(lines) + "\n", media_type=PROM)
    return json_response({"timestamp": datetime.now(UTC).isoformat(),
                          "version": settings.sglang_version,
                  "accelerator": None, "num_accelerators": settings.tp_size,
                  "loads": [load]})


def _scheduler_labels(settings: SimSettings, rank: int | None) -> dict[str, str]:
    """A scheduler gauge's labels by version: engine_type from 0.4.4, tp_rank and pp_rank
    (dp_rank with DP) from 0.4.10, moe_ep_rank from 0.5.7."""
    r = settings.shape.r
    labels = {"model_name": settings.served_model_name}
    if r >= (0, 4, 4, 0):
        labels["engine_type"] = "unified"
    if r >= (0, 4, 10, 0):
        labels.update(pp_rank="0", tp_rank="0")
        if rank is not None:
            labels["dp_rank"] = str(rank)
            if settings.dp_attention:
                labels["tp_rank"] = str(rank * max(1, settings.tp_size // settings.dp_size))
    if r >= (0, 5, 7, 0):
        labels["moe_ep_rank"] = "0"
    return labels


def _rank_gauges(model: SimModel, settings: SimSettings) -> list[tuple[str, str, list[tuple[
        dict[str, str], float]]]]:
    """With DP, the load gauges one series per rank (0.4.10+); before, one series that the
    rank that wrote last owns (prometheus `mostrecent`): here rank 0's."""
    cfg = model.cfg
    ranked = settings.shape.metrics_rank_labels
    ranks = range(len(model.ranks)) if ranked else range(1)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for rank in ranks:
        labels = _scheduler_labels(settings, rank if ranked else None)
        running = [r for r in model.running if r.dp_rank == rank and not r.health]
        used = sum(r.prompt_tokens + r.generated for r in running)
        last = model.rank_last.get(rank)
        for name, value in (
                ("num_running_reqs", len(running)),
                ("num_queue_reqs", len(model.waiting) // len(model.ranks)),
                ("gen_throughput", last.gen_throughput if last is not None else 0.0),
                ("token_usage", used / cfg.max_total_num_tokens),
                ("num_used_tokens", used)):
            out.setdefault(name, []).append((labels, value))
    return [(name, HELP[name], samples) for name, samples in out.items()]


HELP = {"num_running_reqs": "The number of running requests.",
        "num_queue_reqs": "The number of requests in the waiting queue.",
        "gen_throughput": "The generation throughput (token/s).",
        "token_usage": "The token usage.", "num_used_tokens": "The number of used tokens."}


def metrics(model: SimModel, settings: SimSettings) -> str:
    """`GET /metrics`: SGLang's gauges, counters and histograms."""
    cfg = model.cfg
    sched = _scheduler_labels(settings, None)
    tok = {"model_name": settings.served_model_name}
    if settings.shape.r >= (0, 4, 4, 0):
        tok["engine_type"] = "unified"
    used = model.used_tokens()
    pool = model.pool
    spec = cfg.spec
    e = _Exposition()
    gauges: list[tuple[str, str, float]] = [
        ("num_running_reqs", "The number of running requests.", len(model.running)),
        ("num_queue_reqs", "The number of requests in the waiting queue.",
         len(model.waiting)),
        ("gen_throughput", "The generation throughput (token/s).",
         model.last.gen_throughput),
        ("cache_hit_rate", "The prefix cache hit rate.", model.last.cache_hit_rate),
        ("token_usage", "The token usage.", used / cfg.max_total_num_tokens),
        ("mamba_usage", "The token usage for Mamba layers.",
         len(model.running) / (3 * cfg.max_running_requests) if settings.hybrid_log else 0),
        ("num_used_tokens", "The number of used tokens.", used),
        ("kv_available_tokens", "Number of free token slots in the KV cache pool.",
         cfg.max_total_num_tokens - used),
        ("kv_evictable_tokens", "Number of evictable (radix-cached) token slots in the KV "
         "cache pool.", 0),
        ("kv_used_tokens", "Number of actively used token slots in the KV cache pool.", used),
        ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
         cfg.max_total_num_tokens),
        ("context_len", "Maximum context length.", cfg.context_length),
        ("utilization", "The utilization.", len(model.running) / cfg.max_running_requests),
        ("new_token_ratio", "The new token ratio.", pool.ratio if pool else INIT_RATIO),
        # SGLang prints these with speculative decoding off too, as 0.
        ("spec_accept_length", "Mean acceptance length of speculative decoding (accepted "
         "drafts + bonus token per forward).", model.last.accept_length if spec else 0),
        ("spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed "
         "drafts` in batch).", model.last.accept_rate if spec else 0),
        ("spec_num_steps", "Currently active speculative_num_steps.",
         cfg.spec_num_steps if spec else 0),
        ("spec_num_draft_tokens", "Currently active speculative_num_draft_tokens (decouples "
         "from steps under topk>1).", cfg.spec_num_draft_tokens if spec else 0),
    ]
    ranked = dict.fromkeys(HELP) if len(model.ranks) > 1 else {}
    for name, text, samples in _rank_gauges(model, settings) if ranked else ():
        e.family(f"sglang:{name}", "gauge", text, [(f"sglang:{name}", labels, value)
                                                  for labels, value in samples])
    for name, text, value in gauges:
        if name not in ranked:
            e.family(f"sglang:{name}", "gauge", text, [(f"sglang:{name}", sched, value)])
    # A gauge of SGLang's default multiprocess mode: one series per process, pid labelled;
    # the newest retraction's size until the next stats line, then 0.
    e.family("sglang:num_retracted_reqs", "gauge", "The number of retracted requests.",
             [("sglang:num_retracted_reqs", dict(sched, pid=str(os.getpid())),
               model.last.retracted)])

    def by_stream(counter: dict[str, int]) -> list[tuple[dict[str, str], float]]:
        return [(dict(tok, is_streaming=k), float(v)) for k, v in sorted(counter.items())]

    counters: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = [
        ("prompt_tokens_total", "Number of prefill tokens processed.",
         by_stream(model.prompt_tokens_total)),
        ("generation_tokens_total", "Number of generation tokens processed.",
         by_stream(model.generation_tokens_total)),
        ("num_requests_total", "Number of requests processed.",
         by_stream(model.num_requests_total)),
        ("cached_tokens_total", "Number of cached prompt tokens by source "
         "(device/host/storage).",
         [(dict(tok, cache_source="device"), model.cached_tokens_total)]),
    ]
    # SGLang's labelled counters print no sample before their first increment.
    if model.aborted_total:
        counters.append(("num_aborted_requests_total", "Number of requests aborted.",
                         [(tok, model.aborted_total)]))
    if cfg.spec:
        counters.append(("spec_verify_calls_total", "Number of speculative decoding "
                         "verification calls.", [(tok, model.verify_calls_total)]))
    if pool is not None and pool.retracted_reqs_total:
        counters += [(f"num_retracted_{what}_total", f"Total number of retracted {text}.",
                      [(sched, value)]) for what, text, value in (
            ("requests", "requests", pool.retracted_reqs_total),
            ("input_tokens", "input tokens", pool.retracted_input_tokens_total),
            ("output_tokens", "output tokens", pool.retracted_output_tokens_total))]
    for name, text, samples in counters:
        e.family(f"sglang:{name}", "counter", text,
                 [(f"sglang:{name}", labels, v) for labels, v in samples])
    e.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token "
                "in seconds.", model.ttft, tok, "is_streaming")
    e.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency "
                "in seconds.", model.itl, tok, None)
    e.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request "
                "latency in seconds", model.e2e, tok, "is_streaming")
    e.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                model.queue_time, sched, None)
    return e.text()
