"""Rates from a recent window: an exponentially weighted moving average over ticks."""

from __future__ import annotations

import math
import time


class EwmaRate:
    """Events per second, weighted towards the last `tau_s` seconds (not the lifetime mean).

    Each tick's span weighs by its length (1 - e^(-dt/tau)), and the average is divided by the
    weight seen so far (the start-up correction of Adam's moments): a rate that has watched
    less than `tau_s` is the mean over what it watched, not a value dragged towards zero. An
    engine's first tick often comes milliseconds after its start, with nothing done yet; taken
    as the whole starting rate, that empty instant held a resumed run's rate (its ETA, the
    share a rebalance gives it) near zero for a minute."""

    def __init__(self, tau_s: float = 60.0, now: float | None = None) -> None:
        self.tau_s = tau_s
        self._last = time.monotonic() if now is None else now
        self._pending = 0.0
        self._acc = 0.0  # the weighted average, biased towards 0 by the unseen past
        self._weight = 0.0  # 1 - e^(-watched/tau): the share of the window seen so far

    def add(self, n: float = 1.0) -> None:
        self._pending += n

    def tick(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        dt = now - self._last
        if dt <= 0:
            return self.rate
        alpha = -math.expm1(-dt / self.tau_s)
        self._acc += alpha * (self._pending / dt - self._acc)
        self._weight += alpha * (1.0 - self._weight)
        self._pending = 0.0
        self._last = now
        return self.rate

    @property
    def rate(self) -> float:
        return self._acc / self._weight if self._weight > 0 else 0.0
