"""The simulator's periodic prefill and decode batch lines, as SGLang's scheduler logs them
(in the form of the version it plays): what the agent's log reader reads. With `--dp-size N`
each DP rank logs its own lines, at its own instants, tagged with its rank."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agents.sim.logs import log
from agents.sim.model import SimModel
from agents.sim.settings import SimSettings
from agents.sim.stats import RankCounters, Window


def prefill_line(settings: SimSettings, w: Window, forward_ct: int) -> str:
    v = settings.shape
    parts = [f"#new-seq: {w.new_seqs}", f"#new-token: {w.new_tokens}",
             f"#cached-token: {w.cached_tokens}"]
    if v.r < (0, 4, 4, 0):
        prompt = w.new_tokens + w.cached_tokens
        parts.append(f"cache hit rate: {100 * w.cached_tokens / max(1, prompt):.2f}%")
    parts += [f"token usage: {w.token_usage:.2f}", f"#running-req: {w.running}",
              f"#queue-req: {w.queued}"]
    tail = v.prefill_tail
    throughput = f"input throughput (token/s): {w.input_throughput:.2f}"
    if tail == "pending+graph":
        parts += ["#pending-token: 0", "cuda graph: False", throughput]
    elif tail == "graph":
        parts += ["cuda graph: False", throughput]
    elif tail == "throughput+graph":
        parts += [throughput, "cuda graph: False"]
    return _line(settings, "Prefill", parts, forward_ct)


def decode_line(settings: SimSettings, w: Window, spec: bool, mamba_size: int,
                forward_ct: int) -> str:
    v = settings.shape
    parts = [f"#running-req: {w.running}"]
    if settings.hybrid_log:
        parts += [f"#full token: {w.used_tokens}", f"full token usage: {w.token_usage:.2f}",
                  f"mamba num: {w.running}", f"mamba usage: {w.running / mamba_size:.2f}"]
    else:
        parts += [f"#token: {w.used_tokens}", f"token usage: {w.token_usage:.2f}"]
    if spec and v.accept_len:
        parts.append(f"accept len: {w.accept_length:.2f}")
        if v.accept_rate:
            parts.append(f"accept rate: {w.accept_rate:.2f}")
    if v.graph_field:
        parts.append("cuda graph: True")
    parts += [f"gen throughput (token/s): {w.gen_throughput:.2f}", f"#queue-req: {w.queued}"]
    return _line(settings, "Decode", parts, forward_ct)


def _line(settings: SimSettings, kind: str, parts: list[str], forward_ct: int) -> str:
    v = settings.shape
    return (f"{v.head(kind, forward_ct)} " + ", ".join(parts)
            + (", " if v.trailing_separator else ""))


@dataclass
class _RankView:
    """A rank's counters at its last line, and when that was."""

    at: float
    seen: RankCounters


def rank_window(model: SimModel, rank: int, view: _RankView) -> Window:
    """What DP rank `rank` did since its last line: its own tokens, passes and prefills, its
    share of the running batch and of the KV (each rank has a pool of its own), and an equal
    share of the queue (the simulator queues before it picks a rank)."""
    now = model.clock()
    c = model.ranks[rank]
    seen = view.seen
    elapsed = max(now - view.at, 1e-9)
    dp = len(model.ranks)
    running = [r for r in model.running if r.dp_rank == rank and not r.health]
    w = Window()
    w.tokens = c.tokens - seen.tokens
    verify = c.verify - seen.verify
    w.new_seqs = c.new_seqs - seen.new_seqs
    w.new_tokens = c.new_tokens - seen.new_tokens
    w.cached_tokens = c.cached_tokens - seen.cached_tokens
    # A decode line comes from a batch that ran: a rank whose requests all ended since its
    # last line still ran them.
    w.running = max(len(running), 1 if w.tokens else 0)
    w.used_tokens = sum(r.prompt_tokens + r.generated for r in running)
    w.queued = len(model.waiting) // dp + (rank < len(model.waiting) % dp)
    w.token_usage = w.used_tokens / model.cfg.max_total_num_tokens
    w.gen_throughput = w.tokens / elapsed
    w.input_throughput = w.new_tokens / elapsed
    if verify > 0:
        w.accept_length = w.tokens / verify
        w.accept_rate = (w.tokens - verify) / (verify * model.cfg.spec_num_steps)
    view.at = now
    view.seen = RankCounters(c.tokens, c.verify, c.new_seqs, c.new_tokens, c.cached_tokens)
    return w


async def decode_log(model: SimModel, settings: SimSettings) -> None:
    """Every decode-log interval, close the model's window (what its gauges report); a server
    logs what it saw, a DP server has each rank log its own lines (rank_log) instead."""
    interval = max(0.02, model.cfg.wall(settings.decode_log_interval_s))
    ranks = len(model.ranks)
    await asyncio.gather(server_log(model, settings, interval, quiet=ranks > 1),
                         *(rank_log(model, settings, r, interval) for r in range(ranks)
                           if ranks > 1))


async def server_log(model: SimModel, settings: SimSettings, interval: float,
                     quiet: bool) -> None:
    cfg = model.cfg
    tags = settings.scheduler_tags
    forward_ct = 0
    while True:
        await asyncio.sleep(interval)
        w = model.take_window()
        if quiet:
            continue
        forward_ct += 1
        if w.new_seqs:  # one line sums the window's prefills (SGLang logs each batch)
            log(prefill_line(settings, w, forward_ct), tags)
        if w.tokens:
            log(decode_line(settings, w, cfg.spec, 3 * cfg.max_running_requests, forward_ct),
                tags)


async def rank_log(model: SimModel, settings: SimSettings, rank: int, interval: float) -> None:
    """DP rank `rank`'s lines: ranks do not log at the same instant, so each starts its
    interval a fraction of it after the one before."""
    cfg = model.cfg
    tags = settings.rank_tags(rank)
    view = _RankView(model.clock(), RankCounters())
    await asyncio.sleep(interval * rank / len(model.ranks))
    forward_ct = 0
    while True:
        await asyncio.sleep(interval)
        w = rank_window(model, rank, view)
        model.rank_last[rank] = w
        forward_ct += 1
        if w.new_seqs:
            log(prefill_line(settings, w, forward_ct), tags)
        if w.tokens:
            cap = 3 * cfg.max_running_requests // len(model.ranks)
            log(decode_line(settings, w, cfg.spec, max(1, cap), forward_ct), tags)
