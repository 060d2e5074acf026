"""What a server says of its own load, as the engine gets it: SGLang's figures (/metrics, its
log), read by the supervisor on every refresh and handed to `Engine.server_figures`. Deadlines
use them before a server has answered and to allow for its queue and retractions; the
auto-tuner uses them to tell a level that only fills the server's queue or its KV pool from
one that adds throughput. None: the server does not say (never 0)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerLoad:
    running: int | None = None  # requests in the running batch
    queued: int | None = None  # requests waiting in the server's queue
    gen_throughput: float | None = None  # output tokens/s over the running batch
    token_usage: float | None = None  # the KV pool's share in use
    # Requests retracted (sent back to the queue when decoding ran out of KV room) that the
    # supervisor has seen since it began to watch: a count that only grows.
    retracted: int = 0


__all__ = ["ServerLoad"]
