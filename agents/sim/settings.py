"""The SGLang simulator's server-level settings (the simulated GPU's are in `config.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    launch_command: str = ""
    server_args: dict[str, Any] = field(default_factory=dict)

    @property
    def scheduler_tags(self) -> str:
        return (" DP0" if self.dp_size > 1 else "") + (" TP0" if self.tp_size > 1 else "")
