"""Reading an SGLang server's own figures: /server_info, /metrics (Prometheus text) and the
decode log line (both the standard and the hybrid Qwen3.5/3.6 form), tolerant of old forms."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SAMPLE = re.compile(r"^(sglang:[A-Za-z0-9_]+)(?:\{[^}]*\})?\s+(\S+)")
_DECODE = re.compile(r"Decode batch[.,]\s*(.*)$")
_FIELD = re.compile(r"(#?[A-Za-z][A-Za-z ()/#-]*?):\s*([-0-9.eE+]+|True|False)")


@dataclass(slots=True)
class ServerFigures:
    running_reqs: int | None = None
    queued_reqs: int | None = None
    gen_throughput: float | None = None
    token_usage: float | None = None
    accept_length_window: float | None = None
    accept_length_cum: float | None = None
    effective_max_running: int | None = None
    accept_length_log: float | None = None


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of each sglang:* sample family over its label sets (one scheduler per server)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def figures_from_metrics(metrics: dict[str, float], fig: ServerFigures) -> None:
    def get(name: str) -> float | None:
        return metrics.get(f"sglang:{name}")

    running, queued = get("num_running_reqs"), get("num_queue_reqs")
    fig.running_reqs = int(running) if running is not None else fig.running_reqs
    fig.queued_reqs = int(queued) if queued is not None else fig.queued_reqs
    fig.gen_throughput = get("gen_throughput") if get("gen_throughput") is not None \
        else fig.gen_throughput
    fig.token_usage = get("token_usage") if get("token_usage") is not None else fig.token_usage
    acc = get("spec_accept_length")
    if acc:
        fig.accept_length_window = acc


def figures_from_server_info(info: dict[str, Any], fig: ServerFigures) -> None:
    states = info.get("internal_states") or []
    if not states or not isinstance(states[0], dict):
        return
    st = states[0]
    acc = st.get("avg_spec_accept_length")
    fig.accept_length_cum = float(acc) if isinstance(acc, int | float) else None
    cap = st.get("effective_max_running_requests_per_dp")
    if isinstance(cap, int):
        fig.effective_max_running = cap
    elif isinstance(info.get("max_running_requests"), int):
        fig.effective_max_running = info["max_running_requests"]
    thr = st.get("last_gen_throughput")
    if isinstance(thr, int | float) and fig.gen_throughput is None:
        fig.gen_throughput = float(thr)


def parse_decode_line(line: str) -> dict[str, float] | None:
    """`Decode batch, #running-req: 48, ... accept len: 2.87, ...` -> {'#running-req': 48, ...}"""
    m = _DECODE.search(line)
    if not m:
        return None
    fields: dict[str, float] = {}
    for key, value in _FIELD.findall(m.group(1)):
        key = key.strip()
        if value in ("True", "False"):
            continue
        try:
            fields[key] = float(value)
        except ValueError:
            continue
    return fields


def last_decode_line(log: Path, tail_bytes: int = 65536) -> dict[str, float] | None:
    """The newest decode line in a server log (read from its end only)."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            data = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    for line in reversed(data.splitlines()):
        parsed = parse_decode_line(line)
        if parsed:
            return parsed
    return None


def figures_from_log(fields: dict[str, float], fig: ServerFigures) -> None:
    acc = fields.get("accept len")
    if acc:
        fig.accept_length_log = acc
    if fig.running_reqs is None and "#running-req" in fields:
        fig.running_reqs = int(fields["#running-req"])
    if fig.queued_reqs is None and "#queue-req" in fields:
        fig.queued_reqs = int(fields["#queue-req"])
    if fig.gen_throughput is None and "gen throughput (token/s)" in fields:
        fig.gen_throughput = fields["gen throughput (token/s)"]
    usage = fields.get("token usage", fields.get("full token usage"))
    if fig.token_usage is None and usage is not None:
        fig.token_usage = usage
