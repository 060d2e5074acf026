"""Where the next request goes: per-server limits that change at run time, the healthy server
with the most free room, servers set aside after failures and probed until they answer."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from agents.engine.client import ServerClient, probe
from agents.ewma import EwmaRate

ANSWERS_KEPT = 4096


@dataclass(slots=True)
class Server:
    number: int
    url: str
    client: ServerClient
    limit: int
    in_flight: int = 0
    state: str = "healthy"
    completed: int = 0
    failed: int = 0
    errors_in_row: int = 0
    last_error: str | None = None
    down_since: float | None = None
    output_tokens: int = 0
    verify_ct: int = 0
    spec_tokens: int = 0
    req_rate: EwmaRate = field(default_factory=lambda: EwmaRate(30.0))
    tok_rate: EwmaRate = field(default_factory=lambda: EwmaRate(30.0))
    # The latest answers as (finished, monotonic; output tokens; latency s): what the
    # auto-tuner measures (agents/engine/autotune.py).
    answers: deque[tuple[float, int, float]] = field(
        default_factory=lambda: deque(maxlen=ANSWERS_KEPT))

    @property
    def room(self) -> int:
        return self.limit - self.in_flight

    def count_completion(self, completion_tokens: int, spec_verify_ct: int | None,
                         latency_s: float | None = None) -> None:
        """One answer: the request and token rates, and the accept length's two sums."""
        if latency_s is not None:
            self.answers.append((time.monotonic(), completion_tokens, latency_s))
        self.completed += 1
        self.req_rate.add()
        self.tok_rate.add(completion_tokens)
        self.output_tokens += completion_tokens
        if spec_verify_ct:
            self.verify_ct += spec_verify_ct
            self.spec_tokens += completion_tokens

    @property
    def accept_length(self) -> float | None:
        return self.spec_tokens / self.verify_ct if self.verify_ct else None


class Dispatcher:
    def __init__(self, servers: list[Server], failures_to_down: int, probe_interval_s: float,
                 probe_timeout_s: float) -> None:
        self.servers = servers
        self.failures_to_down = failures_to_down
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.paused = False
        self.closed = False
        self._changed = asyncio.Condition()
        self._waiting_retries = 0

    async def notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _pick(self, avoid: int | None) -> Server | None:
        best: Server | None = None
        fallback: Server | None = None
        for s in self.servers:
            if s.state != "healthy" or s.room <= 0:
                continue
            if s.number == avoid:
                fallback = s
                continue
            if best is None or s.room > best.room:
                best = s
        if best is None and fallback is not None:
            # Another server is preferred for a retry, but not at the price of waiting when the
            # only healthy one is the one that failed.
            others = [s for s in self.servers if s.state == "healthy" and s.number != avoid]
            if not others:
                return fallback
        return best

    async def acquire(self, avoid: int | None = None, retry: bool = False) -> Server | None:
        """Wait for room on a healthy server; None when the engine is closing."""
        async with self._changed:
            if retry:
                self._waiting_retries += 1
            try:
                while True:
                    if self.closed:
                        return None
                    # New work waits while retries wait: a retry goes first.
                    if not self.paused and (retry or self._waiting_retries == 0):
                        server = self._pick(avoid)
                        if server is not None:
                            server.in_flight += 1
                            return server
                    await self._changed.wait()
            finally:
                if retry:
                    self._waiting_retries -= 1

    def try_acquire(self, avoid: Collection[int],
                    rank: Callable[[Server], float]) -> Server | None:
        """Room on a healthy server not in `avoid`, the highest `rank` first, now or never
        (a hedge: it takes only room nobody waits for)."""
        if self.closed or self.paused or self._waiting_retries:
            return None
        free = [s for s in self.servers
                if s.state == "healthy" and s.room > 0 and s.number not in avoid]
        if not free:
            return None
        server = max(free, key=rank)
        server.in_flight += 1
        return server

    async def release(self, server: Server) -> None:
        server.in_flight -= 1
        await self.notify()

    def record_success(self, server: Server) -> None:
        server.errors_in_row = 0

    def record_failure(self, server: Server, message: str, connect_error: bool) -> bool:
        """Count a server fault; True when the server was just set aside."""
        server.errors_in_row += 1
        server.last_error = message[:300]
        if server.state == "healthy" and (connect_error or
                                          server.errors_in_row >= self.failures_to_down):
            server.state = "down"
            server.down_since = time.time()
            return True
        return False

    async def close(self) -> None:
        self.closed = True
        await self.notify()

    async def probe_forever(self) -> None:
        """Bring set-aside servers back once /health answers 200 again."""
        while not self.closed:
            down = [s for s in self.servers if s.state == "down"]
            if down:
                results = await asyncio.gather(
                    *(probe(s.client, self.probe_timeout_s) for s in down)
                )
                for s, ok in zip(down, results, strict=True):
                    if ok:
                        s.state = "healthy"
                        s.errors_in_row = 0
                        s.down_since = None
                if any(results):
                    await self.notify()
            await asyncio.sleep(self.probe_interval_s)
