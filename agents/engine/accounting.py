"""Run totals and rates, and the progress.json they make. Counted when lines are durable."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agents.ewma import EwmaRate
from agents.rundir.schema import Progress, ServerProgress, progress_decoder


@dataclass(slots=True)
class Totals:
    """Cumulative counters carried across restarts through progress.json."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    truncated: int = 0
    empty: int = 0
    retried: int = 0
    lines: int = 0

    @classmethod
    def from_progress(cls, raw: bytes | None) -> Totals:
        if not raw:
            return cls()
        try:
            p = progress_decoder.decode(raw)
        except Exception:
            return cls()
        return cls(
            input_tokens=p.total_input_tokens,
            output_tokens=p.total_output_tokens,
            reasoning_tokens=p.total_reasoning_tokens,
            truncated=p.truncated,
            empty=p.empty,
            retried=p.retried,
            lines=p.completed,
        )


@dataclass(slots=True)
class Meter:
    totals: Totals
    started_at: float = field(default_factory=time.time)
    rate: EwmaRate = field(default_factory=lambda: EwmaRate(60.0))

    def eta_hours(self, remaining: int) -> float | None:
        r = self.rate.rate
        if remaining <= 0:
            return 0.0
        return remaining / r / 3600.0 if r > 0 else None


def server_progress(number: int, url: str, state: str, in_flight: int, limit: int,
                    completed: int, failed: int, req_per_s: float, tok_per_s: float,
                    accept_length: float | None, errors_in_row: int,
                    last_error: str | None) -> tuple[str, ServerProgress]:
    return str(number), ServerProgress(
        url=url, state=state,  # type: ignore[arg-type]
        in_flight=in_flight, limit=limit, completed=completed, failed=failed,
        req_per_s=round(req_per_s, 3), tok_per_s=round(tok_per_s, 1),
        accept_length=round(accept_length, 3) if accept_length is not None else None,
        errors_in_row=errors_in_row, last_error=last_error,
    )


__all__ = ["Meter", "Progress", "Totals", "server_progress"]
