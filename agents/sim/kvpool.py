"""The simulated KV cache pool of `--max-total-tokens N`, as SGLang 0.5.23 runs its own: a
request is admitted only when its tokens fit beside what the running batch holds and is
expected to grow to, and when the next decode step does not fit, requests are retracted back
to the queue. Read from sglang/srt/managers/: scheduler.py `update_running_batch`,
schedule_batch.py `retract_decode`, schedule_policy.py `PrefillAdder`,
scheduler_components/new_token_ratio_tracker.py, mem_cache/prefill_budget.py.

A request holds prompt + generated tokens. The running batch is expected to grow by each
request's remaining max_new_tokens (clipped at 4,096) times the new-token ratio (1 for
ignore_eos); a newcomer needs its own tokens and its whole clipped max_new. The ratio starts
at 0.7, falls by 0.7 x 0.86 / 600 per decode step to 0.098, jumps after a retraction to what
the batch left has generated over what it may, and starts again at 0.7 when the server is
idle. After an admission is refused, none is tried until a request leaves the batch
(SGLang's batch_is_full)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_RATIO = INIT_RATIO * 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
DECAY_PER_STEP = (INIT_RATIO - MIN_RATIO) / 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
PAGE = 1  # --page-size 1: each newcomer reserves one page more


class Held(Protocol):
    """What the pool needs of a request."""

    prompt_tokens: int
    generated: int
    max_new: int
    ignore_eos: bool


def held(r: Held) -> int:
    """KV tokens a running request holds."""
    return r.prompt_tokens + r.generated


def remaining(r: Held) -> int:
    return min(max(r.max_new - r.generated, 0), CLIP_MAX_NEW_TOKENS)


H = TypeVar("H", bound=Held)


@dataclass
class Retraction(Generic[H]):
    """One "KV cache pool is full. Retract requests." event."""

    victims: list[H]
    gained: int
    old_ratio: float
    new_ratio: float

    def log_line(self) -> str:
        """SGLang's warning, word for word (scheduler.py update_running_batch)."""
        return ("KV cache pool is full. Retract requests. "
                f"#retracted_reqs: {len(self.victims)}, #new_tokens_gained: {self.gained}, "
                f"#new_token_ratio: {self.old_ratio:.4f} -> {self.new_ratio:.4f}")


class KVPool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.ratio = INIT_RATIO
        self.blocked = False  # an admission was refused; none until a request leaves
        self.retracted_reqs_total = 0
        self.retracted_input_tokens_total = 0
        self.retracted_output_tokens_total = 0
        self.last_event_reqs = 0  # the newest retraction's size, until the next stats line
        self.refusals = 0  # admissions refused for KV room (a request then waits)

    def used(self, running: Sequence[Held]) -> int:
        return sum(held(r) for r in running)

    def expected(self, running: Sequence[Held]) -> float:
        """What the running batch holds and is expected still to need."""
        return sum(held(r) + remaining(r) * (1.0 if r.ignore_eos else self.ratio)
                   for r in running)

    def need(self, r: Held) -> int:
        """A newcomer's reservation: its tokens (a retracted request's prompt and output
        again), a page, and its whole clipped max_new."""
        return held(r) + PAGE + remaining(r)

    def fits(self, running: Sequence[Held], pending: float, r: Held) -> bool:
        """Admission beside the batch that ran last step (`running`) and the newcomers
        already taken in this round (`pending` tokens reserved)."""
        return self.need(r) + pending < self.size - self.expected(running)

    def step(self, running: Sequence[H], tokens: float) -> Retraction[H] | None:
        """Before decoding `tokens` more for each request (steps, fractional across ticks):
        retract while they do not fit, fewest generated first (then the longest prompt),
        keeping one; else decay the ratio by that many steps."""
        step = math.ceil(tokens)
        if not running or self.used(running) + step * len(running) <= self.size:
            self.ratio = max(MIN_RATIO, self.ratio - DECAY_PER_STEP * tokens)
            return None
        keep = sorted(running, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        victims: list[H] = []
        while len(keep) > 1 and (not victims or self.used(keep) + step * len(keep)
                                 > self.size):
            victims.append(keep.pop())
        if not victims:
            return None
        old = self.ratio
        generated = sum(r.generated for r in keep)
        allowed = sum(r.max_new for r in keep)
        self.ratio = min(1.0, (generated + RETRACT_DECODE_STEPS * len(keep)) / (allowed + 1))
        self.retracted_reqs_total += len(victims)
        self.retracted_input_tokens_total += sum(r.prompt_tokens for r in victims)
        self.retracted_output_tokens_total += sum(r.generated for r in victims)
        self.last_event_reqs = len(victims)
        self.blocked = False
        return Retraction(victims, sum(held(r) for r in victims), old, self.ratio)

    def overflows_alone(self, running: Sequence[Held], tokens: float) -> bool:
        """One request left and even it does not fit: SGLang aborts it."""
        return len(running) == 1 and self.used(running) + math.ceil(tokens) > self.size

    def idle(self) -> None:
        self.ratio = INIT_RATIO
        self.blocked = False
