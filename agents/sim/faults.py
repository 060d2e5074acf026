"""Faults on demand for the SGLang simulator: the settings `POST /sim/faults` edits, the
per-request draw, and the simulated scheduler crash."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, NoReturn

from agents.sim.logs import log


@dataclass
class Faults:
    """Faults on demand (flags at start, `POST /sim/faults` later)."""

    error_rate: float = 0.0  # an HTTP error (error_status) with an SGLang error body
    error_status: int = 500  # the status those errors carry (400-599)
    hang_rate: float = 0.0  # held, never answered until aborted or the client goes away
    crash_after_requests: int | None = None  # os._exit when request N+1 arrives
    crash_after_seconds: float | None = None  # os._exit after T simulated seconds
    slow_factor: float = 1.0  # divides decode and prefill speed
    garbage_rate: float = 0.0  # 200 with a body that is not JSON
    empty_rate: float = 0.0  # content "" and no reasoning

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply a partial update, all or nothing; ValueError names a bad key or value."""
        known = {f.name for f in fields(self)}
        clean: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in known:
                raise ValueError(f"unknown fault {key!r}; known: {sorted(known)}")
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key.startswith("crash_after") and value is None:
                clean[key] = None
            elif key == "error_status":
                if not isinstance(value, int) or isinstance(value, bool) or \
                        not 400 <= value <= 599:
                    raise ValueError(f"error_status must be an HTTP error status 400-599, "
                                     f"not {value!r}")
                clean[key] = value
            elif not number or value < 0:
                raise ValueError(f"{key} must be a number >= 0, not {value!r}")
            elif key.endswith("_rate") and value > 1:
                raise ValueError(f"{key} is a share in [0, 1], not {value!r}")
            elif key == "slow_factor" and value == 0:
                raise ValueError("slow_factor must be > 0")
            else:
                clean[key] = int(value) if key == "crash_after_requests" else float(value)
        for key, value in clean.items():
            setattr(self, key, value)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def draw(self, rng: random.Random, requests_since_set: int) -> str | None:
        """The fault the `requests_since_set`-th request since the last change meets, if
        any: "crash", "error", "hang", "garbage" or "empty"."""
        if (self.crash_after_requests is not None
                and requests_since_set > self.crash_after_requests):
            return "crash"
        draw = rng.random()
        for name, rate in (("error", self.error_rate), ("hang", self.hang_rate),
                           ("garbage", self.garbage_rate), ("empty", self.empty_rate)):
            if draw < rate:
                return name
            draw -= rate
        return None


def crash(why: str, tags: str = "") -> NoReturn:
    """Die as a CUDA fault kills SGLang: one scheduler exception line, then exit 1."""
    log("Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access "
        f"was encountered (simulated fault: {why})", tags)
    os._exit(1)
