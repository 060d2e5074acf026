"""Hand-written status snapshots and fleets for the TUI's snapshot tests: fixed numbers, fixed
times (everything is relative to T0, and the app's clock is frozen at NOW)."""

from __future__ import annotations

import json
from typing import Any

from console.fleet import ConsoleSettings, Fleet, Node

T0 = 1_760_000_000.0
NOW = T0 + 100.0


def server(n: int, state: str = "healthy", **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "number": n, "url": f"http://127.0.0.1:{30000 + n}", "state": state, "gpu": n,
        "port": 30000 + n, "pid": 1000 + n, "restarts": 0, "in_flight": 40, "limit": 40,
        "completed": 128_000 + 97 * n, "failed": 30 + n, "req_per_s": 2.05 + 0.01 * n,
        "tok_per_s": 2230.0 + 10 * n, "queued_reqs": 3 + n % 3, "accept_length": 3.0 + n / 100,
        "metrics_at": NOW - 1, "health_checked_at": NOW - 1,
        "gpu_stats": {"util_pct": 97.0, "mem_used_mib": 170_000.0 + n,
                      "mem_total_mib": 183_359.0, "temp_c": 61.0 + n, "power_w": 905.0 + n},
    }
    base.update(kw)
    return base


def autotune(level: int, phase: str = "settled", best: float = 32.0) -> dict[str, Any]:
    """The auto-tuner's state: levels tried from 4 up, tokens/s peaking near `best`."""
    levels = [lv for lv in (4, 6, 9, 14, 21, 32, 48) if lv <= max(level, 6) * 1.5 + 1]
    curve = [{"concurrency": lv, "tok_per_s": round(lv * 250 / (1 + lv / 16 + (lv / best) ** 2),
                                                    1),
              "latency_s": round(lv / 60, 2), "requests": 40, "at": NOW - 900 + 60 * i}
             for i, lv in enumerate(levels)]
    return {"level": level, "phase": phase, "cap": 48, "best": level, "curve": curve,
            "next_probe_at": NOW + 1700 if phase == "settled" else None,
            "note": f"{level} -> {levels[-1]}: +1.2% tok/s, latency +48%: back to {level}"}


def progress(**kw: Any) -> dict[str, Any]:
    servers = {str(n): {"url": f"http://127.0.0.1:{30000 + n}", "state": "healthy",
                        "in_flight": 40, "limit": 40, "completed": 128_000, "failed": 30,
                        "req_per_s": 2.05, "tok_per_s": 2230.0, "accept_length": 3.0}
               for n in range(7)}
    # Auto-tuned: GPUs 0-2 settled at their knees, GPU 4 still measuring; 5 and 6 by hand.
    for n, tune in ((0, autotune(32)), (1, autotune(21, best=24.0)), (2, autotune(32)),
                    (4, autotune(14, "measuring"))):
        servers[str(n)].update(autotune=tune, in_flight=tune["level"], limit=tune["level"])
    base: dict[str, Any] = {
        "total": 913_786, "completed": 451_203, "failed": 1_093, "rate_per_sec": 14.37,
        "eta_hours": 8.94, "total_input_tokens": 115_402_118, "total_output_tokens": 812_030_331,
        "avg_output_tokens": 1799.7, "elapsed_hours": 8.71, "s3_uploaded": 902,
        "s3_bytes": 3_897_000_000, "status": "running", "truncated": 81_216, "empty": 1_804,
        "max_tokens": 8192, "concurrency": 40, "in_flight": 280, "retried": 312,
        "s3_pending": 1, "control_rev": 7, "updated_at": NOW - 1, "servers": servers,
        "run": "qwen-traces", "batches_closed": 902,
        "eta_p10_hours": 7.81, "eta_p90_hours": 10.62, "gpus": 7, "gpu_hours": 61.0,
        "cost": {"per_gpu_hour": 2.49, "usd": 151.89, "per_mtok_usd": 0.187,
                 "projected_usd": 307.72},
    }
    base.update(kw)
    return base


def generate_snapshot(**kw: Any) -> dict[str, Any]:
    tuned = {0: 32, 1: 21, 2: 32, 4: 14}  # the levels progress() gives the auto-tuned ones
    servers = [server(n, in_flight=tuned.get(n, 40), limit=tuned.get(n, 40)) for n in range(7)]
    servers[3] = server(3, "restarting", restarts=2, in_flight=0, tok_per_s=0.0, req_per_s=0.0,
                        queued_reqs=None, last_error="ReadTimeout: no answer within 600 s",
                        gpu_stats={"util_pct": 0.0, "mem_used_mib": 512.0,
                                   "mem_total_mib": 183_359.0, "temp_c": 38.0,
                                   "power_w": 140.0})
    servers[5]["gpu_stats"] = None  # NVML absent for this one: dashes, never zeros
    servers[6]["metrics_at"] = NOW - 41  # its /metrics stopped answering: shown with its age
    base: dict[str, Any] = {
        "kind": "generate", "run": "qwen-traces", "run_dir": "/data/runs/qwen-traces",
        "host": "gpu-box-7", "status": "running", "updated_at": NOW - 1, "source": "supervisor",
        "agent_version": "0.1.0", "supervisor_pid": 4242, "progress": progress(),
        "progress_age_s": 0.4, "servers": servers,
        "alerts": [{"code": "server_restarts", "severity": "warning",
                    "message": "server 3 restarted 2 times in 10 min", "since": NOW - 300,
                    "server": 3}],
        "disk": {"path": "/data", "free_bytes": 1_210_000_000_000,
                 "total_bytes": 3_840_000_000_000, "hours_to_full": 61.5},
    }
    base.update(kw)
    return base


def train_snapshot(**kw: Any) -> dict[str, Any]:
    train = {
        "kind": "train", "run": "dflash-qwen", "step": 6_400, "total_steps": 20_000,
        "epoch": 1, "epochs": 3, "loss": 1.8342,
        "accuracy": [0.912, 0.833, 0.761, 0.69, 0.622, 0.561, 0.5, 0.447, 0.399, 0.352,
                     0.31, 0.27, 0.236, 0.204, 0.177],
        "accept_length": 4.21, "heldout_accept_length": 4.05, "best_accept_length": 4.05,
        "tokens_per_s": 48_210.0, "steps_per_s": 0.41, "lr": 3.0e-4, "eta_hours": 9.2,
        "elapsed_hours": 4.3, "last_checkpoint": "checkpoints/step_006000",
        "best_checkpoint": "checkpoints/step_006000", "status": "running", "world_size": 4,
        "updated_at": NOW - 2,
    }
    servers = [{"number": g, "url": "", "state": "healthy", "gpu": g,
                "gpu_stats": {"util_pct": 99.0, "mem_used_mib": 71_000.0 + g,
                              "mem_total_mib": 81_559.0, "temp_c": 70.0 + g,
                              "power_w": 650.0 + g}} for g in range(4)]
    base: dict[str, Any] = {
        "kind": "train", "run": "dflash-qwen", "run_dir": "/data/runs/dflash", "host": "gpu-4x",
        "status": "running", "updated_at": NOW - 2, "source": "supervisor",
        "agent_version": "0.1.0", "train": train, "servers": servers,
        "disk": {"path": "/data", "free_bytes": 800_000_000_000,
                 "total_bytes": 2_000_000_000_000},
    }
    base.update(kw)
    return base


def fleet(**console: Any) -> Fleet:
    return Fleet(nodes=[
        Node(name="gen-1", run_dir="/data/runs/qwen-traces", host="gpu-box-7", user="ubuntu"),
        Node(name="gen-2", run_dir="/data/runs/qwen-more", host="gpu-box-8", user="ubuntu"),
        Node(name="train-1", run_dir="/data/runs/dflash", host="gpu-4x", role="train"),
        Node(name="gen-3", run_dir="/data/runs/old", host="gpu-box-9", port=2222),
    ], console=ConsoleSettings(**console), source="fleet.toml")


def history_items(n: int = 60) -> list[dict[str, Any]]:
    """n history samples 10 s apart: throughput with a dip, accept length drifting, failures
    in a burst."""
    items = []
    failed = 900
    for i in range(n):
        dip = 0.55 if 30 <= i < 36 else 1.0
        failed += 40 if 40 <= i < 43 else 2
        servers = {str(s): {"tok_per_s": (2000.0 + 8 * ((i * 7 + s) % 11)) * dip,
                            "accept_length": 2.9 + 0.004 * i + 0.01 * s}
                   for s in range(7)}
        items.append({"updated_at": NOW - 10 * (n - i), "rate_per_sec": 14.0 * dip,
                      "failed": failed, "servers": servers})
    return items


def samples() -> dict[str, Any]:
    return {"samples": [
        {"index": 451_202, "finish_reason": "stop", "completion_tokens": 1_204,
         "reasoning_tokens": 873, "reasoning_head": "The user asks for a haiku about GPUs. "
         "I should count syllables: five, seven, five.",
         "content_head": "Silicon rivers\nseven cards hum through the night\nprompts become "
         "answers", "tool_calls": 0, "attempt": 1, "server": 2, "latency_s": 41.3},
        {"index": 451_199, "finish_reason": "length", "completion_tokens": 8_192,
         "reasoning_tokens": 8_192, "reasoning_head": "Let me think about the proof. First, "
         "assume the contrary...", "content_head": "", "tool_calls": 0, "attempt": 2,
         "server": 5, "latency_s": 288.0},
        {"index": 451_197, "finish_reason": "tool_calls", "completion_tokens": 96,
         "reasoning_tokens": 40, "reasoning_head": "I need the weather tool.",
         "content_head": "", "tool_calls": 1, "attempt": 1, "server": 0, "latency_s": 3.1},
    ]}


def failure_summary() -> dict[str, Any]:
    """A `failures` answer: a run whose server 3 went down and whose servers answered 503."""
    def line(n: int, t: float, error: str, server: int | None, message: str) -> dict[str, Any]:
        ev: dict[str, Any] = {"event": "failed", "time": t, "index": n * 7, "error": error,
                              "message": message, "attempts": 3, "server": server}
        return {"line": n, "text": json.dumps(ev, separators=(",", ":"))}

    def group(error: str, count: int, first: float, last: float, servers: list[list[int]],
              examples: list[dict[str, Any]], event: str = "failed",
              no_server: int = 0) -> dict[str, Any]:
        return {"event": event, "error": error, "count": count, "first": first, "last": last,
                "servers": [{"server": s, "count": c} for s, c in servers],
                "servers_more": 0, "no_server": no_server, "examples": examples}

    busy = "The server is busy: the request queue is full, try again later"
    return {"groups": [
        group("http_503", 1_204, T0 - 5400, T0 + 95, [[2, 800], [5, 404]],
              [line(12, T0 - 5400, "http_503", 2, busy), line(3_980, T0 + 80, "http_503", 5,
                                                             busy),
               line(4_011, T0 + 95, "http_503", 2, busy)]),
        group("connect", 312, T0 - 600, T0 - 420, [[3, 312]],
              [line(2_101, T0 - 600, "connect", 3, "Connection refused"),
               line(2_412, T0 - 420, "connect", 3, "Connection refused")]),
        group("deadline", 57, T0 - 3000, T0 + 60, [[3, 40], [1, 17]],
              [{"line": 900, "text": '{"event":"requeued","time":1759997000.0,"index":8812,'
                                     '"attempt":1,"what":"deadline","server":3,"message":'
                                     '"no answer after 96.0 s (deadline 95.2 s)"}'}],
              event="requeued"),
        group("bad_input", 9, T0 - 7000, T0 - 6900, [],
              [line(1, T0 - 7000, "bad_input", None, "line 18: not JSON")], no_server=9),
        group("timeout", 3, T0 - 200, T0 - 100, [[6, 3]],
              [line(3_300, T0 - 200, "timeout", 6, "ReadTimeout after 600 s")]),
    ], "events": 1_585, "retries": 1, "other": 0, "unreadable": 0, "bytes_read": 1_912_044,
        "bytes_total": 1_912_044, "complete": True, "lines": 1_586}


def log_reply() -> dict[str, Any]:
    """An answer to `logs` (a tail): the engine's log around a KV-pressure episode."""
    t = "2026-12-06 09:41:"
    lines = [f"{t}{s:02d},120 INFO agents.engine.run: batch {417 + s} closed: 100 lines, "
             f"0 failed" for s in range(24)]
    lines[9] = (f"{t}09,884 WARNING agents.engine.dispatch: server 1: KV cache pool is full; "
                "SGLang retracted 3 requests")
    lines[15] = (f"{t}15,002 ERROR agents.engine.client: server 1: request 88213 failed: "
                 "ServerDisconnectedError")
    lines[16:16] = ["Traceback (most recent call last):",
                    '  File "agents/engine/client.py", line 211, in post',
                    "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"]
    lines[21] = f"{t}18,450 INFO agents.engine.run: retried 3 retracted requests on server 0"
    body = "".join(f"{x}\n" for x in lines).encode()
    return {"path": "/runs/qwen3-distill/logs/generate.log", "size": len(body),
            "lines": lines, "next_before": None, "inode": 1, "next_from": len(body),
            "unfinished": False}


def history_items_hours(hours: float = 6.0, step_s: float = 60.0) -> list[dict[str, Any]]:
    """History as the node's store serves a long span: a sample per `step_s` over `hours`
    ending at NOW. Throughput climbs as the tuner settles in the first hour, halves for 40
    minutes (server 3 down) two hours before NOW, and failures come in that outage."""
    n = int(hours * 3600 / step_s)
    items = []
    failed = 200
    for i in range(n):
        age_s = (n - 1 - i) * step_s
        ramp = min(1.0, 0.6 + 0.4 * i * step_s / 3600)
        down = 2 * 3600 <= age_s < 2 * 3600 + 2400
        failed += 25 if down else (i % 5 == 0)
        servers = {str(s): {"tok_per_s": 0.0 if down and s == 3 else
                            (2000.0 + 9 * ((i * 5 + s) % 13)) * ramp * (0.8 if down else 1.0),
                            "accept_length": 2.8 + 0.25 * i / n + 0.01 * s}
                   for s in range(7)}
        items.append({"updated_at": NOW - age_s, "rate_per_sec": 14.0 * ramp
                      * (0.55 if down else 1.0), "failed": failed, "servers": servers})
    return items


def recorded_history(n: int = 120) -> list[dict[str, Any]]:
    """A finished run's history.jsonl as the engine wrote it: n progress samples 10 s apart
    from T0; server 3 restarts a third of the way in (no answers for 2 minutes, failures
    then); accept length drifts up; the last sample is the run done."""
    items = []
    completed, failed, out_tokens = 0, 0, 0
    per_server = [0] * 7
    failed_per = [0] * 7
    for i in range(n):
        restarting = n // 3 <= i < n // 3 + 12
        done = i == n - 1
        rate = 14.2 + 0.6 * ((i * 7) % 5) / 4 - (2.1 if restarting else 0.0)
        servers = {}
        for g in range(7):
            down = restarting and g == 3
            share = 0.0 if down else rate / (6 if restarting else 7)
            per_server[g] += int(share * 10)
            failed_per[g] += 4 if down else (i % 9 == g)
            servers[str(g)] = {
                "url": f"http://127.0.0.1:{30000 + g}", "state": "restarting" if down
                else "healthy", "in_flight": 0 if down or done else 40, "limit": 40,
                "completed": per_server[g], "failed": failed_per[g],
                "req_per_s": 0.0 if done else round(share, 3),
                "tok_per_s": 0.0 if down or done else 2230.0 + 15 * ((i + g) % 6),
                "accept_length": round(2.9 + 0.003 * i + 0.01 * g, 3),
                "last_error": "ReadTimeout: no answer within 600 s" if down else None}
        completed, failed = sum(per_server), sum(failed_per)
        out_tokens += int(rate * 10 * 1800)
        items.append(progress(
            total=17_500, completed=completed, failed=failed, servers=servers,
            rate_per_sec=0.0 if done else rate,
            eta_hours=None if done else (17_500 - completed) / rate / 3600, eta_p10_hours=None,
            eta_p90_hours=None, elapsed_hours=i * 10 / 3600, total_output_tokens=out_tokens,
            total_input_tokens=completed * 256, avg_output_tokens=1800.0,
            truncated=completed * 6 // 100, empty=completed // 250, retried=failed // 2,
            updated_at=T0 + 10 * i, status="done" if done else "running",
            in_flight=0 if done else 268, s3_uploaded=completed // 100, s3_pending=0,
            s3_bytes=completed // 100 * 4_300_000, batches_closed=completed // 100, cost=None,
            gpu_hours=7 * i * 10 / 3600))
    return items
