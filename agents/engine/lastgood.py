"""The last good control: when control.json cannot be read (truncated, not JSON, a folder) or
holds values out of range, the engine keeps what it applied last and says so; it never stops
on it. At start, with nothing applied yet, the last good control is the one progress.json
reports the engine ran with (rev, concurrency, max_tokens, paused), else run.toml's values."""

from __future__ import annotations

import msgspec

from agents.rundir.schema import Concurrency, Control, RetryRequests


class _Applied(msgspec.Struct):
    """What progress.json says the engine ran with."""

    control_rev: int = 0
    concurrency: int | None = None
    max_tokens: int | None = None
    paused: bool = False


_applied_decoder = msgspec.json.Decoder(_Applied)


def control_problem(control: Control) -> str | None:
    """Why a decoded control cannot be applied, or None."""
    if control.max_tokens < 1:
        return f"max_tokens must be at least 1, got {control.max_tokens}"
    if control.concurrency.default < 0:
        return f"concurrency.default must not be negative, got {control.concurrency.default}"
    for server, value in control.concurrency.servers.items():
        if value < 0:
            return f"concurrency.servers[{server!r}] must not be negative, got {value}"
    return None


def last_good_control(progress_raw: bytes | None, concurrency: int, max_tokens: int,
                      retry_applied: dict[str, int]) -> Control:
    """The control to run with when control.json is unusable at start. Retry counters are
    those already applied (journal), so nothing is retried because of the fallback."""
    applied = _Applied()
    if progress_raw:
        try:
            applied = _applied_decoder.decode(progress_raw)
        except msgspec.DecodeError:
            pass
    good_concurrency = applied.concurrency if applied.concurrency is not None \
        and applied.concurrency >= 0 else concurrency
    good_tokens = applied.max_tokens if applied.max_tokens is not None \
        and applied.max_tokens >= 1 else max_tokens
    return Control(rev=max(applied.control_rev, 0),
                   concurrency=Concurrency(default=good_concurrency),
                   max_tokens=good_tokens, paused=applied.paused,
                   retry=RetryRequests(failed=retry_applied.get("failed", 0),
                                       truncated=retry_applied.get("truncated", 0),
                                       long=retry_applied.get("long", 0)))
