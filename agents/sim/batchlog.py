"""The simulator's periodic prefill and decode batch lines, as SGLang's scheduler logs them:
what the agent's log parser reads."""

from __future__ import annotations

import asyncio

from agents.sim.logs import log
from agents.sim.model import SimModel
from agents.sim.settings import SimSettings


async def decode_log(model: SimModel, settings: SimSettings) -> None:
    """Every decode-log interval, close the model's window and log what it saw."""
    cfg = model.cfg
    interval = max(0.02, cfg.wall(settings.decode_log_interval_s))
    tags = settings.scheduler_tags
    while True:
        await asyncio.sleep(interval)
        w = model.take_window()
        if w.new_seqs:  # one line sums the window's prefills (SGLang logs each batch)
            log(f"Prefill batch, #new-seq: {w.new_seqs}, #new-token: {w.new_tokens}, "
                f"#cached-token: {w.cached_tokens}, token usage: {w.token_usage:.2f}, "
                f"#running-req: {w.running}, #queue-req: {w.queued}, #pending-token: 0, "
                f"cuda graph: False, input throughput (token/s): {w.input_throughput:.2f}",
                tags)
        if not w.tokens:
            continue
        if settings.hybrid_log:
            mamba_size = 3 * cfg.max_running_requests
            tokens = (f"#full token: {w.used_tokens}, full token usage: "
                      f"{w.token_usage:.2f}, mamba num: {w.running}, mamba usage: "
                      f"{w.running / mamba_size:.2f}")
        else:
            tokens = f"#token: {w.used_tokens}, token usage: {w.token_usage:.2f}"
        spec = (f"accept len: {w.accept_length:.2f}, accept rate: {w.accept_rate:.2f}, "
                if cfg.spec else "")
        log(f"Decode batch, #running-req: {w.running}, {tokens}, {spec}cuda graph: True, "
            f"gen throughput (token/s): {w.gen_throughput:.2f}, #queue-req: {w.queued}",
            tags)
