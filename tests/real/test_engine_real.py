"""The engine against SGLang itself: every field of its chat request is one the real server
reads (its pydantic model ignores the others without a word), usage and finish reasons per
line against the server's own counters, every deadline abort confirmed by the server, and no
false alarm on a loaded box. The engine runs as `fleetdeck-agent generate RUN.toml` with
`[servers] urls = [the shared server]`; every figure is compared with the server's /metrics
deltas around the test or with the lines on disk."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.engine.client import build_request, parse_response, rid_for
from agents.engine.prompts import Prompt
from agents.rundir.sampling import ENGINE_KEYS, SAMPLING_KEYS, sampling_problem
from tests.engine.runs import (
    EngineProc,
    RunState,
    read_run,
    start_engine,
    write_prompts,
    write_spec,
)
from tests.real.env import RealEnv
from tests.real.server import Metrics, RealServer
from tests.servers.ports import wait_until

# A server start-up can fall inside the first test of a session (50-160 s here).
pytestmark = pytest.mark.timeout(600)

ENGINE_TIMEOUT_S = 300.0

# One value of the right type for every sampling key, and one SGLang refuses.
GOOD_SAMPLING: dict[str, Any] = {
    "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "frequency_penalty": 0.1,
    "presence_penalty": 0.1, "repetition_penalty": 1.1, "seed": 3, "min_tokens": 1,
    "ignore_eos": False, "skip_special_tokens": True, "no_stop_trim": False,
    "stop": ["zzzz"], "stop_regex": ["zzzz"], "stop_token_ids": [5],
    "logit_bias": {"5": -1.0}, "regex": "[a-z ]+", "ebnf": 'root ::= "a" | "b"',
    "response_format": {"type": "text"}, "tool_choice": "none", "parallel_tool_calls": True,
    "reasoning_effort": "low",
}
BAD_SAMPLING: dict[str, Any] = {
    "temperature": "hot", "top_p": "x", "top_k": "x", "min_p": "x", "frequency_penalty": "x",
    "presence_penalty": "x", "repetition_penalty": "x", "seed": "x", "min_tokens": "x",
    "ignore_eos": "maybe", "skip_special_tokens": "maybe", "no_stop_trim": "maybe",
    "stop": 5, "stop_regex": 5, "stop_token_ids": "x", "logit_bias": "x", "regex": 5,
    "ebnf": 5, "response_format": {"type": "bogus"}, "tool_choice": 5,
    "parallel_tool_calls": "maybe", "reasoning_effort": "loud",
}
# The same for what the engine itself puts in every request.
BAD_ENGINE_FIELDS: dict[str, Any] = {
    "model": 5, "messages": "x", "max_tokens": "x", "stream": "maybe", "rid": 5,
    "separate_reasoning": "maybe", "return_spec_tokens_details": "maybe",
    "chat_template_kwargs": "x", "tools": [{"bad": 1}],
}
TOOLS = [{"type": "function", "function": {"name": "search",
                                           "parameters": {"type": "object", "properties": {}}}}]


# -- helpers -----------------------------------------------------------------------------------

def _request_model(env: RealEnv) -> dict[str, Any]:
    """SGLang's own ChatCompletionRequest, read in the server's interpreter: its fields and
    what it does with a field it does not know."""
    code = ("import json; from sglang.srt.entrypoints.openai.protocol import "
            "ChatCompletionRequest as C; print(json.dumps({'fields': sorted(C.model_fields), "
            "'extra': C.model_config.get('extra')}))")
    out = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env.server_env()}, timeout=300, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _chat(server: RealServer, **fields: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4, **fields}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def _chats(server: RealServer, variants: list[dict[str, Any]]) -> list[httpx.Response]:
    """_chat for each variant, a few at a time."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda v: _chat(server, **v), variants))


def _run(tmp_path: Path, server: RealServer, n: int, *, prompts: Path | None = None,
         **generate: Any) -> EngineProc:
    tmp_path.mkdir(parents=True, exist_ok=True)
    if prompts is None:
        prompts = tmp_path / "prompts.jsonl"
        write_prompts(prompts, n)
    generate.setdefault("request_timeout_s", 3600.0)
    spec = write_spec(tmp_path / "run.toml", prompts, [server.url], **generate)
    return start_engine(spec)


def _finish(engine: EngineProc) -> tuple[RunState, dict[str, Any]]:
    """The engine to its end (exit 0), the run as a reader sees it (invariant 1 asserted on
    the way), and its last progress.json."""
    try:
        rc = engine.wait(ENGINE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        engine.kill()
        raise AssertionError(f"engine still running after {ENGINE_TIMEOUT_S:.0f} s:\n"
                             f"{engine.stderr()[-3000:]}") from None
    assert rc == 0, engine.stderr()[-3000:]
    progress = engine.progress()
    assert progress is not None and progress["status"] == "done", progress
    return read_run(engine.run_dir), progress


def _verify(run_dir: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "agents.cli", "verify", str(run_dir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "failures.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _deadline_events(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in _events(run_dir) if (e["event"], e.get("what")) == ("requeued", "deadline")
            or (e["event"], e.get("error")) == ("failed", "deadline")]


def _lines(state: RunState) -> list[dict[str, Any]]:
    return [state.current[i] for i in sorted(state.current)]


def _assert_accounting(lines: list[dict[str, Any]], before: Metrics, after: Metrics) -> None:
    """With nothing aborted, the lines are every request the server counted, token for token."""
    assert after.delta(before, "num_aborted_requests_total") == 0
    assert after.delta(before, "num_requests_total") == len(lines)
    assert after.delta(before, "generation_tokens_total") == \
        sum(x["usage"]["completion_tokens"] for x in lines)
    assert after.delta(before, "prompt_tokens_total") == \
        sum(x["usage"]["prompt_tokens"] for x in lines)


@contextmanager
def _cpu_hog() -> Iterator[subprocess.Popen[bytes]]:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield hog
    finally:
        hog.kill()
        hog.wait(timeout=10)


BURST_RUN = 200  # the engine's prompts in the burst test


class _Burst:
    """Another client's long answers on the same server, in a thread: 40 of them fill the
    server's KV reservation, so what comes after them waits in its queue. rids `burst-NNN.`
    by default: fixed width and a full stop, so that none is a prefix of another (SGLang
    aborts every rid that starts with the one named)."""

    def __init__(self, url: str, n: int = 40, max_tokens: int = 4000,
                 rids: list[str] | None = None) -> None:
        self.url = url
        self.rids = rids if rids is not None else [f"burst-{i:03d}." for i in range(n)]
        self.max_tokens = max_tokens
        self.answers: list[dict[str, Any]] = []
        self._answered: set[str] = set()  # rids whose answer came (written by the thread)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._send()), daemon=True)

    async def _send(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=600) as client:
            async def one(rid: str) -> dict[str, Any]:
                r = await client.post("/v1/chat/completions", json={
                    "model": "tiny", "messages": [{"role": "user", "content": f"go {rid}"}],
                    "max_tokens": self.max_tokens, "ignore_eos": True, "rid": rid})
                assert r.status_code == 200, r.text
                answer: dict[str, Any] = r.json()
                self._answered.add(rid)
                return answer
            self.answers = list(await asyncio.gather(*(one(r) for r in self.rids)))

    def start(self) -> None:
        self._thread.start()

    def abort(self, rids: list[str] | None = None, again_s: float = 30.0,
              timeout: float = 240.0) -> list[dict[str, Any]]:
        """Abort `rids` (all by default, the last sent first) and wait for every answer. The
        last sent are the queued ones: aborted before any running one frees its KV room, they
        are never admitted; in sending order, each running abort let queued ones in, and on a
        loaded box every one of them had made tokens before its own abort came (ci).

        An abort for a rid the server does not hold yet is nothing (SGLang answers 200 and
        forgets it): on a box with a CPU hog two of the 40 requests reached the server after
        their abort and ran their 4,000 tokens for minutes (ci). So a rid whose answer has
        not come is aborted again every `again_s` (long enough for an abort that was taken
        to be answered, so none is aborted twice)."""
        named = list(reversed(self.rids)) if rids is None else list(rids)
        deadline = time.monotonic() + timeout
        while True:
            for rid in named:
                if rid not in self._answered:
                    r = httpx.post(f"{self.url}/abort_request", json={"rid": rid}, timeout=30)
                    assert r.status_code == 200 and r.content == b""
            self._thread.join(timeout=max(0.0, min(again_s, deadline - time.monotonic())))
            if not self._thread.is_alive() or time.monotonic() >= deadline:
                break
        assert not self._thread.is_alive(), "the burst's answers did not come after its abort"
        assert [a["id"] for a in self.answers] == self.rids
        return self.answers


# -- 1. every field we send is one SGLang reads ----------------------------------------------

def test_every_field_the_engine_sends_is_read_by_sglangs_request_model(
        real_env: RealEnv, server: RealServer) -> None:
    model = _request_model(real_env)
    fields = set(model["fields"])
    # Unknown fields are dropped without a word: a 200 proves nothing, hence this test.
    assert model["extra"] != "forbid"
    typo = _chat(server, temprature="hot")
    assert typo.status_code == 200, typo.text
    prompt = Prompt(index=0, id=None, messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
    body = build_request(prompt, "tiny", 8, dict(GOOD_SAMPLING),
                         {"enable_thinking": False}, rid=rid_for(0, 1, 1, "abcd0123"))
    assert set(body) <= fields, sorted(set(body) - fields)
    assert set(SAMPLING_KEYS) <= fields, sorted(set(SAMPLING_KEYS) - fields)
    assert set(ENGINE_KEYS) <= fields, sorted(set(ENGINE_KEYS) - fields)
    assert set(BAD_SAMPLING) == set(GOOD_SAMPLING) == set(SAMPLING_KEYS)
    # Each is read under its name: a bad value is refused, naming it. Pydantic lists the
    # fields it refused in one answer; one its (cut) message leaves out is asked alone.
    bad = {**BAD_SAMPLING, **BAD_ENGINE_FIELDS}
    r = _chat(server, **bad)
    assert r.status_code == 400, r.text[:300]
    unnamed = [k for k in bad if f"('body', '{k}'" not in r.text]
    for key, r in zip(unnamed, _chats(server, [{k: bad[k]} for k in unnamed]), strict=True):
        assert r.status_code == 400 and f"('body', '{key}'" in r.text, (key, r.text[:300])
    # Our load-time check and the server agree on what a value may be: the types each
    # takes (SGLang checks the rest itself: a response_format or reasoning_effort it does
    # not know is a 400).
    wrong_type = {**BAD_SAMPLING, "response_format": "text", "reasoning_effort": ["low"]}
    for key in SAMPLING_KEYS:
        wrong = wrong_type[key]
        assert sampling_problem({key: wrong}) is not None, key
        assert sampling_problem({key: GOOD_SAMPLING[key]}) is None, key
    # ...and take each good value: the three grammars one at a time (one per request).
    grammars = ("regex", "ebnf", "response_format")
    variants = [{k: v for k, v in GOOD_SAMPLING.items() if k not in grammars}]
    variants += [{k: GOOD_SAMPLING[k]} for k in grammars]
    for variant, r in zip(variants, _chats(server, variants), strict=True):
        assert r.status_code == 200, (sorted(variant), r.text[:300])
    # chat_template_kwargs reaches the template step: the one key it refuses says so.
    r = _chat(server, chat_template_kwargs={"chat_template": "{{ x }}"})
    assert r.status_code == 400 and "Request-supplied chat_template is not allowed" in r.text


def test_rid_reasoning_and_spec_fields_as_the_real_server_answers(server: RealServer) -> None:
    """rid is the id the server knows (it answers with it); separate_reasoning needs a
    --reasoning-parser and return_spec_tokens_details speculative decoding, which this server
    has neither of: the answer has no reasoning_content and no sglext, and our parser gives
    the text as content and no accept length, as for any server without them."""
    info = server.server_info()
    assert info["reasoning_parser"] is None and info["speculative_algorithm"] is None
    prompt = Prompt(index=3, id=None, messages=[{"role": "user", "content": "hi"}], tools=None)
    rid = rid_for(3, 1, 1, "abcd0123")
    body = build_request(prompt, "tiny", 8, {"temperature": 0.0}, {}, rid=rid)
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    raw = r.json()
    assert raw["id"] == rid
    assert "sglext" not in raw and raw["choices"][0]["message"]["reasoning_content"] is None
    parsed = parse_response(r.status_code, r.content, 0.1)
    assert parsed.spec_verify_ct is None and parsed.reasoning_content is None
    assert isinstance(parsed.content, str) and parsed.content
    assert parsed.completion_tokens == raw["usage"]["completion_tokens"] > 0


def test_the_runs_sampling_and_template_kwargs_have_their_effect(tmp_path: Path,
                                                                 server: RealServer) -> None:
    """Through the engine: a grammar (ebnf) shapes every answer, temperature 0 gives one
    answer per prompt, chat_template_kwargs go along; the server's counters agree."""
    prompts = tmp_path / "prompts.jsonl"
    texts = [f"Question {i % 4}: say something" for i in range(12)]  # each prompt three times
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n"
                               for t in texts))
    before = server.metrics()
    grammar = _run(tmp_path / "ebnf", server, 0, prompts=prompts, max_tokens=16,
                   sampling={"temperature": 1.5, "ebnf": 'root ::= "yes" | "no"'},
                   chat_template_kwargs={"enable_thinking": False})
    state, _ = _finish(grammar)
    lines = _lines(state)
    assert len(lines) == 12
    assert {x["content"] for x in lines} <= {"yes", "no"}, [x["content"] for x in lines]
    assert all(x["finish_reason"] == "stop" and x["reasoning_content"] is None
               and x["spec_verify_ct"] is None for x in lines)
    assert all(x["chat_template_kwargs"] == {"enable_thinking": False} for x in lines)
    greedy = _run(tmp_path / "greedy", server, 0, prompts=prompts, max_tokens=16,
                  sampling={"temperature": 0.0})
    state, _ = _finish(greedy)
    by_prompt: dict[str, set[str]] = {}
    for x in _lines(state):
        by_prompt.setdefault(x["messages"][0]["content"], set()).add(x["content"])
    assert len(by_prompt) == 4 and all(len(v) == 1 for v in by_prompt.values()), by_prompt
    _assert_accounting(lines + _lines(state), before, server.metrics())


# -- 2. usage and finish_reason against the server's counters ----------------------------------

def test_usage_and_finish_reasons_match_the_servers_own_counters(tmp_path: Path,
                                                                 server: RealServer) -> None:
    max_tokens = 24
    before = server.metrics()
    # 64 stop tokens of 2,048 at temperature 1: some answers stop, most hit the limit.
    engine = _run(tmp_path, server, 40, max_tokens=max_tokens, concurrency_per_server=16,
                  sampling={"temperature": 1.0, "stop_token_ids": list(range(100, 164))})
    state, progress = _finish(engine)
    after = server.metrics()
    lines = _lines(state)
    assert len(lines) == 40 and not state.failed
    _assert_accounting(lines, before, after)
    assert progress["total_output_tokens"] == after.delta(before, "generation_tokens_total")
    assert progress["total_input_tokens"] == after.delta(before, "prompt_tokens_total")
    for x in lines:
        tokens = x["usage"]["completion_tokens"]
        assert 0 < tokens <= max_tokens and x["max_tokens"] == max_tokens
        # SGLang 0.5.23: a stop token beats the length cap in the same step, so a stop may
        # land on the last token; a length finish is always the whole budget.
        if x["finish_reason"] == "length":
            assert tokens == max_tokens, x
        else:
            assert x["finish_reason"] == "stop", x
    finishes = Counter(x["finish_reason"] for x in lines)
    assert finishes["stop"] > 0 and finishes["length"] > 0, finishes
    assert progress["truncated"] == finishes["length"]
    _verify(engine.run_dir)


# -- 3. deadline aborts, confirmed on the server ------------------------------------------------

def test_every_deadline_abort_is_confirmed_by_the_server(tmp_path: Path,
                                                         server: RealServer) -> None:
    """A burst from another client fills the server: the engine's copies wait in its queue
    (or crawl in its batch) past their deadline. Each is aborted by its rid, the server
    answers finish_reason abort, and its retry, once the burst is gone, makes the one line."""
    before = server.metrics()
    # Enough prompts that the engine still sends when the burst comes: on an idle box 16
    # of them were all answered before the burst filled the server.
    engine = _run(tmp_path, server, BURST_RUN, max_tokens=16, concurrency_per_server=4,
                  min_deadline_s=1.0, retries=10, sampling={"temperature": 0.6})
    wait_until(lambda: (engine.progress() or {}).get("completed", 0) >= 6, 180,
               "the engine's first answers (its pace)", proc=engine.proc)
    burst = _Burst(server.url)
    burst.start()
    try:
        wait_until(lambda: (engine.progress() or {}).get("deadline_misses", 0) >= 3, 180,
                   "deadline misses behind the burst", proc=engine.proc)
    finally:
        answers = burst.abort()
    state, progress = _finish(engine)
    after = server.wait_idle()
    assert all(a["choices"][0]["finish_reason"] == "abort" for a in answers)
    misses = progress["deadline_misses"]
    assert misses >= 3
    # The journal says each miss before its copy went out again; none gave up for good.
    assert len(_deadline_events(engine.run_dir)) == misses
    assert not state.failed and len(state.current) == BURST_RUN
    # The server let go of every copy given up on: it answered each with finish_reason
    # abort, and its own abort counter holds them beside the burst's. An answer that ended
    # while its abort was on the way is kept (late_answers) and may be counted there too.
    assert progress["aborts_confirmed"] == misses
    aborted = after.delta(before, "num_aborted_requests_total") - len(answers)
    assert misses <= aborted <= misses + progress["late_answers"], (aborted, progress)
    assert after["num_running_reqs"] == 0 and after["num_queue_reqs"] == 0
    lines = _lines(state)
    assert after.delta(before, "generation_tokens_total") >= \
        sum(x["usage"]["completion_tokens"] for x in lines) + \
        sum(a["usage"]["completion_tokens"] for a in answers)
    _verify(engine.run_dir)


def test_abort_request_on_the_real_server(server: RealServer) -> None:
    """What the engine's /abort_request meets: 200 and an empty body, also for a rid the
    server does not hold (then not counted); a queued request answers at once with no
    tokens and is not counted as a request; a running one answers with what it made; and
    a rid aborts every rid it is a prefix of, which is why ours are prefix-free."""
    before = server.metrics()
    unknown = httpx.post(f"{server.url}/abort_request", json={"rid": "no-such-rid"}, timeout=30)
    assert unknown.status_code == 200 and unknown.content == b""
    assert server.metrics().delta(before, "num_aborted_requests_total") == 0
    burst = _Burst(server.url)
    burst.start()
    wait_until(lambda: server.metrics()["num_queue_reqs"] > 0, 120,
               "the burst queued at the server (its KV reservation full)")
    answers = burst.abort()
    after = server.wait_idle()
    assert all(a["choices"][0]["finish_reason"] == "abort" for a in answers)
    made = [a["usage"]["completion_tokens"] for a in answers]
    assert 0 in made and any(made), made  # some waited in the queue, some ran
    assert after.delta(before, "num_aborted_requests_total") == len(answers)
    assert after.delta(before, "num_requests_total") == sum(1 for t in made if t > 0)
    assert after.delta(before, "generation_tokens_total") == sum(made)
    # Prefixes: aborting "pfx-1" ends "pfx-10" too.
    pair = _Burst(server.url, rids=["pfx-1", "pfx-10"])
    pair.start()
    wait_until(lambda: server.metrics()["num_running_reqs"] >= 2, 120, "both running")
    assert [a["choices"][0]["finish_reason"] for a in pair.abort(["pfx-1"])] == ["abort"] * 2
    rids = [rid_for(i, a, c, "abcd0123") for i in (1, 10, 11) for a in (1, 10) for c in (1, 10)]
    assert not [(x, y) for x in rids for y in rids if x != y and y.startswith(x)]


# -- 4. no false alarms on a loaded box -------------------------------------------------------

def test_no_false_alarm_on_a_loaded_box(tmp_path: Path, server: RealServer) -> None:
    """Default deadlines and hedging, a few hundred requests, and a CPU hog from the first
    answers on (this box's server slows several-fold under it): nothing is aborted, nothing
    is hedged (one server: a copy never goes to the server it is on), and the lines are the
    server's requests, token for token."""
    before = server.metrics()
    engine = _run(tmp_path, server, 150, max_tokens=12, concurrency_per_server=24,
                  sampling={"temperature": 0.6})
    wait_until(lambda: (engine.progress() or {}).get("completed", 0) >= 16, 180,
               "the engine's first answers", proc=engine.proc)
    with _cpu_hog():
        state, progress = _finish(engine)
    after = server.wait_idle()
    lines = _lines(state)
    assert len(lines) == 150 and not state.failed
    assert progress["deadline_misses"] == 0 and not _deadline_events(engine.run_dir)
    assert progress["hedges"] == 0 and progress["hedges_won"] == 0
    assert progress["retried"] == 0
    _assert_accounting(lines, before, after)
    _verify(engine.run_dir)
