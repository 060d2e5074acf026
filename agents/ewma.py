"""Rates from a recent window: an exponentially weighted moving average over ticks."""

from __future__ import annotations

import math
import time


class EwmaRate:
    """Events per second, weighted towards the last `tau_s` seconds (not the lifetime mean)."""

    def __init__(self, tau_s: float = 60.0, now: float | None = None) -> None:
        self.tau_s = tau_s
        self._last = time.monotonic() if now is None else now
        self._pending = 0.0
        self._rate: float | None = None

    def add(self, n: float = 1.0) -> None:
        self._pending += n

    def tick(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        dt = now - self._last
        if dt <= 0:
            return self.rate
        inst = self._pending / dt
        if self._rate is None:
            self._rate = inst
        else:
            alpha = 1.0 - math.exp(-dt / self.tau_s)
            self._rate += alpha * (inst - self._rate)
        self._pending = 0.0
        self._last = now
        return self._rate

    @property
    def rate(self) -> float:
        return self._rate or 0.0
