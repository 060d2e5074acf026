"""What a simulated request generates: its drawn OutputPlan (length, finish, reasoning, tool
call) and the deterministic pseudo-text and token ids that the responses show."""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from agents.sim.config import SimConfig

EOS_TOKEN_ID = 151645  # Qwen's <|im_end|>: what `matched_stop` names on a natural stop
THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
REFERENCE_MAX_TOKENS = 4096  # the limit `--truncation-share` is a share at
LOOP_PERIOD = 12  # words a looping answer repeats (`--loop-share`)


def estimate_tokens(text: str) -> int:
    """Deterministic token estimate for prompt text (~4 characters a token)."""
    return max(1, (len(text) + 3) // 4)


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """What one request will generate. Token layout with thinking: `<think>` (1 token),
    reasoning words (reasoning_len), `</think>` (1 token), answer words or one tool call."""

    n_tokens: int
    finish: str  # "stop" | "length"
    thinking: bool
    reasoning_len: int
    accept_length: float
    offset: int
    tool_name: str | None = None
    tool_arguments: str = "{}"
    empty: bool = False  # the "empty" fault: only an end-of-sequence token, no text
    loop_from: int = 0  # > 0: from this token on the text repeats LOOP_PERIOD words (a loop)

    @property
    def reasoning_tokens(self) -> int:
        """Tokens up to and including `</think>` among the n_tokens generated."""
        return min(self.n_tokens, self.reasoning_len + 2) if self.thinking else 0

    def reasoning_tokens_at(self, n: int) -> int:
        return min(n, self.reasoning_len + 2) if self.thinking else 0

    def verify_ct(self, n: int) -> int:
        return math.ceil(n / self.accept_length) if n > 0 else 0


@dataclass(frozen=True, slots=True)
class Piece:
    reasoning: str  # reasoning text (no tags)
    content: str  # answer text (no tags; empty for a tool call)
    raw: str  # the model's raw text with the think tags, without tool-call markup
    call: str = ""  # raw tool-call markup, in the piece that ends the call

    @property
    def full(self) -> str:
        """All the model printed: what /generate and /v1/completions return."""
        return self.raw + self.call


class TextBank:
    """Cheap deterministic pseudo-words: slices of one seeded word list."""

    _SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "re",
                  "fi", "gu", "ha", "jo", "be", "to", "an", "el")

    def __init__(self, seed: int, size: int = 1 << 15) -> None:
        rng = random.Random(seed * 7919 + 17)
        vocab = []
        for i in range(4096):
            word = "".join(rng.choice(self._SYLLABLES) for _ in range(rng.randint(1, 3)))
            vocab.append(word + ("," if i % 13 == 0 else "." if i % 17 == 0 else ""))
        picks = [rng.randrange(len(vocab)) for _ in range(size)]
        self.size = size
        self.words = [vocab[i] for i in picks]
        self.ids = [1000 + i for i in picks]

    def words_at(self, start: int, count: int) -> list[str]:
        start %= self.size
        out = self.words[start:start + count]
        while len(out) < count:
            out.extend(self.words[: count - len(out)])
        return out

    def ids_at(self, start: int, count: int) -> list[int]:
        start %= self.size
        out = self.ids[start:start + count]
        while len(out) < count:
            out.extend(self.ids[: count - len(out)])
        return out

    def join(self, base: int, i: int, j: int, loop_from: int = 0) -> str:
        """Words i..j-1 of the stream starting at base; pieces concatenate to the whole.
        With `loop_from`, word k >= loop_from is the word LOOP_PERIOD back: a loop."""
        if j <= i:
            return ""
        if loop_from and j > loop_from:
            words = [self.words_at(base + (k if k < loop_from else
                                           loop_from + (k - loop_from) % LOOP_PERIOD), 1)[0]
                     for k in range(i, j)]
            text = " ".join(words)
            return " " + text if i > 0 else text
        text = " ".join(self.words_at(base + i, j - i))
        return " " + text if i > 0 else text

    def pieces(self, plan: OutputPlan, a: int, b: int) -> Piece:
        """Text of tokens [a, b) of a plan."""
        b = min(b, plan.n_tokens)
        if b <= a or plan.empty:
            return Piece("", "", "")
        if plan.thinking:
            r = plan.reasoning_len
            opened = a == 0
            reasoning = self.join(plan.offset, max(a, 1) - 1, min(b, r + 1) - 1, plan.loop_from)
            closed = a <= r + 1 < b
            ans_a, ans_b = max(a, r + 2) - (r + 2), b - (r + 2)
        else:
            opened = closed = False
            reasoning = ""
            ans_a, ans_b = a, b
        content = call = ""
        if ans_b > ans_a:
            if plan.tool_name is not None:
                answer_len = plan.n_tokens - (plan.reasoning_len + 2 if plan.thinking else 0)
                if ans_b >= answer_len:
                    call = ('<tool_call>\n{"name": "' + plan.tool_name + '", "arguments": '
                            + plan.tool_arguments + "}\n</tool_call>")
            else:
                content = self.join(plan.offset + plan.reasoning_len + 1, ans_a, ans_b,
                                    plan.loop_from)
        raw = (THINK_OPEN if opened else "") + reasoning + (THINK_CLOSE if closed else "")
        return Piece(reasoning, content, raw + content, call)


def answer_median(cfg: SimConfig) -> float:
    """The median natural answer length: `answer_median`, or with `truncation_share` set the
    median at which that share of answers runs past REFERENCE_MAX_TOKENS."""
    if cfg.truncation_share is None:
        return cfg.answer_median
    p = min(max(cfg.truncation_share, 1e-4), 1 - 1e-4)
    return REFERENCE_MAX_TOKENS * math.exp(-cfg.answer_spread * NormalDist().inv_cdf(1 - p))


class OutputPlanner:
    """Draws each request's OutputPlan. What the model would write is a function of the
    prompt and the seed alone: its natural length (lognormal: median `answer_median`, log
    spread `answer_spread`), its text, its reasoning share and its tool call; only the limit
    decides where it is cut. So a prompt asked again at a higher max_tokens gets the same
    answer, longer, and raising the limit lowers truncation as it does with a real model.
    Requests without a prompt (health checks) draw from one seeded stream."""

    def __init__(self, config: SimConfig) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.bank = TextBank(config.seed)

    def prompt_rng(self, prompt: str | None) -> random.Random:
        if prompt is None:
            return self.rng
        digest = hashlib.sha256(f"{self.cfg.seed}\x00{prompt}".encode()).digest()
        return random.Random(int.from_bytes(digest[:16], "big"))

    def natural_length(self, prompt: str | None) -> int:
        """The tokens the model would write for this prompt if nothing stopped it."""
        return self._natural(self.prompt_rng(prompt))

    def _natural(self, rng: random.Random) -> int:
        z = rng.gauss(0.0, 1.0)
        return max(1, math.ceil(answer_median(self.cfg) * math.exp(self.cfg.answer_spread * z)))

    def plan(self, max_tokens: int | None, prompt_tokens: int, thinking: bool = True,
             tools: list[Any] | None = None, empty: bool = False,
             ignore_eos: bool = False, prompt: str | None = None) -> OutputPlan:
        """Draw an output: the prompt's natural answer, cut at max_tokens (or at what the
        context leaves), reasoning first when thinking, maybe a tool call."""
        cfg = self.cfg
        accept = 1.0
        if cfg.spec:  # decoding, not the answer: drawn from the stream
            accept = min(cfg.spec_num_steps + 1.0,
                         max(1.0, self.rng.gauss(cfg.accept_length, 0.3)))
        rng = self.prompt_rng(prompt)
        natural = self._natural(rng)
        offset = rng.randrange(self.bank.size)
        if empty:
            return OutputPlan(1, "stop", False, 0, accept, offset, empty=True)
        room = max(1, cfg.context_length - prompt_tokens)
        cap = min(max_tokens, room) if max_tokens and max_tokens > 0 else room
        if cfg.loop_share is not None and rng.random() < cfg.loop_share:
            # Looping (the prompt's own draw: it loops again when sent again): it thinks in
            # circles from a quarter of the way (at most 200 tokens in) to the cut.
            return OutputPlan(cap, "length", thinking, cap if thinking else 0, accept, offset,
                              loop_from=max(1, min(200, cap // 4)))
        reasoning = 0
        if thinking:
            natural = max(natural, 3)
            reasoning = min(natural - 3, round(natural * rng.uniform(0.55, 0.85)))
        if natural >= cap or ignore_eos:
            return OutputPlan(cap, "length", thinking, reasoning, accept, offset)
        if tools and rng.random() < cfg.tool_call_share:
            name, arguments = self._tool_call(tools, rng, offset)
            if name is not None:
                return OutputPlan(natural, "stop", thinking, reasoning, accept, offset,
                                  name, arguments)
        return OutputPlan(natural, "stop", thinking, reasoning, accept, offset)

    def _tool_call(self, tools: list[Any], rng: random.Random,
                   offset: int) -> tuple[str | None, str]:
        tool = tools[rng.randrange(len(tools))]
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return None, "{}"
        params = fn.get("parameters")
        params = params if isinstance(params, dict) else {}
        props = params.get("properties")
        props = props if isinstance(props, dict) else {}
        required = params.get("required")
        required = required if isinstance(required, list) else []
        keys = [k for k in required if isinstance(k, str)] or list(props)[:2]
        words = self.bank.words_at(offset + 101, len(keys))
        args = {k: w.rstrip(",.") for k, w in zip(keys, words, strict=True)}
        return fn["name"], json.dumps(args)
