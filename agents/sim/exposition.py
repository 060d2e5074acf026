"""What the SGLang simulator reports about itself: Prometheus `/metrics` text, `/v1/loads`
and `/server_info`, in SGLang 0.5.x's shapes (shared/reference/sglang.md)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from fastapi.responses import Response

from agents.sim.model import SimModel
from agents.sim.responses import json_response
from agents.sim.settings import SimSettings
from agents.sim.stats import Histogram

SGLANG_VERSION = "0.5.23"
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


def server_info(model: SimModel, settings: SimSettings) -> dict[str, Any]:
    """`GET /server_info`: the server args with the live internal state."""
    cfg = model.cfg
    internal = dict(settings.server_args)
    internal.update({
        "last_gen_throughput": model.last.gen_throughput,
        "effective_max_running_requests_per_dp": cfg.max_running_requests,
        "memory_usage": {"weight": 54.68, "kvcache": round(cfg.max_total_num_tokens
                                                           * 0.000131, 2),
                         "token_capacity": cfg.max_total_num_tokens, "graph": 1.52},
    })
    if cfg.spec and model.avg_spec_accept_length is not None:
        internal["avg_spec_accept_length"] = model.avg_spec_accept_length
    return {**settings.server_args, "launch_command": settings.launch_command,
            "max_total_num_tokens": cfg.max_total_num_tokens,
            "max_req_input_len": min(cfg.context_length, cfg.max_total_num_tokens) - 1,
            "version": SGLANG_VERSION, "internal_states": [internal]}


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
    load: dict[str, Any] = {"dp_rank": 0, "timestamp": time.time()}
    if every or "core" in sections:
        used = model.used_tokens()
        load.update({
            "num_running_reqs": len(model.running), "num_waiting_reqs": len(model.waiting),
            "num_used_tokens": used,
            "num_total_tokens": used + sum(r.prompt_tokens for r in model.waiting),
            "max_total_num_tokens": cfg.max_total_num_tokens,
            "token_usage": used / cfg.max_total_num_tokens,
            "gen_throughput": model.last.gen_throughput,
            "cache_hit_rate": model.last.cache_hit_rate,
            "utilization": len(model.running) / cfg.max_running_requests,
            "max_running_requests": cfg.max_running_requests})
    if (every or "memory" in sections):
        load["memory"] = {"weight_gb": 54.68, "kv_cache_gb": 65.5, "graph_gb": 1.52,
                          "token_capacity": cfg.max_total_num_tokens}
    if (every or "spec" in sections) and cfg.spec:
        load["speculative"] = {"accept_length": model.last.accept_length,
                               "accept_rate": model.last.accept_rate}
    if fmt == "prometheus":
        lines: list[str] = []
        for key, value in load.items():
            if key == "dp_rank":
                continue
            prefix = {"speculative": "spec"}.get(key, key)
            items = ([(f"sglang_{prefix}_{k}", v) for k, v in value.items()]
                     if isinstance(value, dict) else [(f"sglang_{key}", value)])
            for name, v in items:
                lines += [f"# TYPE {name} gauge", f'{name}{{dp_rank="0"}} {v}']
        return Response("\n".join(lines) + "\n", media_type=PROM)
    return json_response({"timestamp": datetime.now(UTC).isoformat(), "version": SGLANG_VERSION,
                  "accelerator": None, "num_accelerators": settings.tp_size,
                  "loads": [load]})


def metrics(model: SimModel, settings: SimSettings) -> str:
    """`GET /metrics`: SGLang's gauges, counters and histograms."""
    cfg = model.cfg
    sched = {"engine_type": "unified", "model_name": settings.served_model_name,
             "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
    tok = {"engine_type": "unified", "model_name": settings.served_model_name}
    used = model.used_tokens()
    e = _Exposition()
    gauges: list[tuple[str, str, float]] = [
        ("num_running_reqs", "The number of running requests.", len(model.running)),
        ("num_queue_reqs", "The number of requests in the waiting queue.",
         len(model.waiting)),
        ("gen_throughput", "The generation throughput (token/s).",
         model.last.gen_throughput),
        ("cache_hit_rate", "The prefix cache hit rate.", model.last.cache_hit_rate),
        ("token_usage", "The token usage.", used / cfg.max_total_num_tokens),
        ("num_used_tokens", "The number of used tokens.", used),
        ("kv_available_tokens", "The number of available KV cache tokens.",
         cfg.max_total_num_tokens - used),
        ("mamba_usage", "The usage of the mamba state pool.",
         len(model.running) / (3 * cfg.max_running_requests) if settings.hybrid_log else 0),
        ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
         cfg.max_total_num_tokens),
        ("utilization", "The utilization.", len(model.running) / cfg.max_running_requests),
    ]
    if cfg.spec:
        gauges += [
            ("spec_accept_length", "Mean acceptance length of speculative decoding "
             "(accepted drafts + bonus token per forward).", model.last.accept_length),
            ("spec_accept_rate", "Acceptance rate of speculative decoding (accepted "
             "drafts / proposed drafts).", model.last.accept_rate),
            ("spec_num_steps", "The number of speculative decoding steps.",
             cfg.spec_num_steps),
            ("spec_num_draft_tokens", "The number of speculative draft tokens.",
             cfg.spec_num_draft_tokens)]
    for name, text, value in gauges:
        e.family(f"sglang:{name}", "gauge", text, [(f"sglang:{name}", sched, value)])

    def by_stream(counter: dict[str, int]) -> list[tuple[dict[str, str], float]]:
        return [(dict(tok, is_streaming=k), float(v)) for k, v in sorted(counter.items())]

    counters: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = [
        ("prompt_tokens_total", "Number of prefill tokens processed.",
         by_stream(model.prompt_tokens_total)),
        ("generation_tokens_total", "Number of generation tokens processed.",
         by_stream(model.generation_tokens_total)),
        ("num_requests_total", "Number of requests processed.",
         by_stream(model.num_requests_total)),
        ("num_aborted_requests_total", "Number of requests aborted.",
         [(tok, model.aborted_total)]),
        ("cached_tokens_total", "Number of cached prompt tokens.",
         [(dict(tok, cache_source="device"), model.cached_tokens_total)]),
    ]
    if cfg.spec:
        counters.append(("spec_verify_calls_total", "Number of speculative decoding "
                         "verification calls.", [(tok, model.verify_calls_total)]))
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
