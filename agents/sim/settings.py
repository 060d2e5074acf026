"""The SGLang simulator's server-level settings (the simulated GPU's are in `config.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.sim.versions import DEFAULT_VERSION, Shape, shape


@dataclass
class SimSettings:
    """The server-level settings (the simulated GPU's live in SimConfig)."""

    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = "Qwen/Qwen3-8B"
    served_model_name: str = "Qwen/Qwen3-8B"
    api_key: str | None = None
    admin_api_key: str | None = None
    enable_metrics: bool = False
    enable_cache_report: bool = False
    reasoning_parser: str | None = "qwen3"
    hybrid_log: bool = False
    decode_log_interval_s: float = 2.0
    tp_size: int = 1
    dp_size: int = 1
    dp_attention: bool = False
    sglang_version: str = DEFAULT_VERSION
    launch_command: str = ""
    server_args: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> Shape:
        return shape(self.sglang_version)

    def rank_tags(self, dp_rank: int) -> str:
        """The `[time tags]` of DP rank dp_rank's scheduler (the one of its attention-TP group
        that logs). With DP attention the DP ranks split one TP group, so DP d's is global TP
        rank d*tp/dp; plain DP runs a TP group per rank, each logging as TP0. Before 0.4.10 the
        DP tag appears with DP attention only (and up to 0.4.6.post1 with any DP)."""
        v = self.shape
        if self.dp_size <= 1:
            return v.tags(None, 0, self.tp_size)
        dp_tag = (self.dp_attention or v.r >= (0, 4, 10, 0) or v.r < (0, 4, 6, 2))
        tp = dp_rank * max(1, self.tp_size // self.dp_size) if self.dp_attention else 0
        return v.tags(dp_rank if dp_tag else None, tp, self.tp_size)

    @property
    def scheduler_tags(self) -> str:
        return self.rank_tags(0)
