"""The simulated GPU's settings: batch cap, throughput curve, output lengths, faults.

Time: every duration here is in simulated seconds; `time_scale` maps it to wall time
(0.001 = everything 1000x faster, 0 = answer at once). Rates and latencies that the model
reports (throughput gauges, histograms) are in wall time, so a client measuring with its own
clock agrees with the server's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.sim.faults import Faults


@dataclass
class SimConfig:
    max_running_requests: int = 48
    accept_length: float = 3.0  # mean tokens per verify forward; <= 0 turns spec decoding off
    spec_num_steps: int = 3
    spec_num_draft_tokens: int = 4
    time_scale: float = 1.0
    load_seconds: float = 2.0
    seed: int = 0
    # Natural answer lengths (tokens), lognormal: the median and the spread of the log. The
    # defaults match the reference run: at max_tokens 4096 about 18% truncated, 1,814 tokens
    # out on average. truncation_share, when set, moves the median instead so that this
    # share of answers runs past 4,096 tokens.
    answer_median: float = 1350.0
    answer_spread: float = 1.21
    truncation_share: float | None = None
    # This share of prompts fall into a repetition loop (a short phrase over and over) and run
    # to max_tokens at any limit, as a looping thinking model does; None: no loops.
    loop_share: float | None = None
    peak_tokens_per_s: float = 250.0  # decode speed of a request running alone
    knee: float = 16.0  # batch size where per-request speed has halved (linear term)
    best_concurrency: float = 40.0  # batch size with the highest total throughput
    prefill_tokens_per_s: float = 40000.0
    tool_call_share: float = 0.5  # share of requests with tools that answer with a call
    context_length: int = 40960
    max_total_num_tokens: int = 500_000  # each DP rank's KV pool
    kv_limit: bool = False  # --max-total-tokens given: admission and retraction by KV tokens
    max_queued_requests: int | None = None  # refuse (503) beyond this many waiting
    dp_size: int = 1  # DP ranks; requests go to them in turn, each logs its own lines
    faults: Faults = field(default_factory=Faults)

    @property
    def spec(self) -> bool:
        return self.accept_length > 0

    def wall(self, sim_seconds: float) -> float:
        """Wall seconds for a simulated duration (timers keep their length at time_scale 0)."""
        return sim_seconds * self.time_scale if self.time_scale > 0 else sim_seconds

    def per_request_rate(self, batch: int) -> float:
        """Simulated decode tokens/s of each request in a batch of `batch`.

        Total = b * peak / (1 + b/knee + (b/best)^2): rises almost linearly, bends at the knee,
        peaks exactly at best_concurrency and then declines gently (KV pressure)."""
        b = max(1, batch)
        return self.peak_tokens_per_s / (1 + b / self.knee + (b / self.best_concurrency) ** 2)

    def total_rate(self, batch: int) -> float:
        return batch * self.per_request_rate(batch)
