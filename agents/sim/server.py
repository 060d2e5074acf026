"""The SGLang simulator's HTTP face: FastAPI routes with SGLang 0.5.x's JSON, SSE and
Prometheus shapes (shared/reference/sglang.md), and its log lines on stdout."""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from agents.sim.model import EOS_TOKEN_ID, Histogram, SimModel, SimRequest, estimate_tokens

SGLANG_VERSION = "0.5.23"
WEIGHT_VERSION = "default"
SSE = "text/event-stream"
PROM = "text/plain; version=0.0.4; charset=utf-8"
FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are "
              "running or waiting requests, the operation will not be performed.)\n")
ADMIN_PATHS = ("/flush_cache", "/abort_request", "/set_internal_state", "/pause_generation",
               "/continue_generation")
OPEN_PREFIXES = ("/health", "/ready", "/metrics", "/sim/")
INTERNAL_STATE_KEYS = ("pp_max_micro_batch_size", "speculative_accept_threshold_single",
                       "speculative_accept_threshold_acc")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def log(message: str, tags: str = "") -> None:
    """One SGLang-format line: `[YYYY-MM-DD HH:MM:SS{ DPn}{ TPn}] message`, flushed."""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{tags}] {message}", flush=True)


@dataclass
class SimSettings:
    """The server-level settings (the simulated GPU's live in SimConfig)."""

    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = "Qwen/Qwen3-8B"
    served_model_name: str = "Qwen/Qwen3-8B"
    api_key: str | None = None
    admin_api_key: str | None = None
    enable_metrics: bool = False
    enable_cache_report: bool = False
    reasoning_parser: str | None = "qwen3"
    hybrid_log: bool = False
    decode_log_interval_s: float = 2.0
    tp_size: int = 1
    dp_size: int = 1
    launch_command: str = ""
    server_args: dict[str, Any] = field(default_factory=dict)

    @property
    def scheduler_tags(self) -> str:
        return (" DP0" if self.dp_size > 1 else "") + (" TP0" if self.tp_size > 1 else "")


def _json(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


def _sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def _openai_error(message: str, status: int, kind: str = "BadRequestError") -> Response:
    return _json({"object": "error", "message": message, "type": kind, "param": None,
                  "code": status}, status)


def _native_error(message: str, status: int) -> Response:
    return _json({"error": {"message": message}}, status)


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


async def _read_json(request: Request) -> dict[str, Any] | str:
    """The JSON object body, or why there is none."""
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype:
        return f"Content-Type must be application/json, not {ctype!r}"
    try:
        obj = msgspec.json.decode(await request.body())
    except msgspec.DecodeError as exc:
        return f"Invalid JSON body: {exc}"
    return obj if isinstance(obj, dict) else "The JSON body must be an object"


class AuthMiddleware:
    """`--api-key` / `--admin-api-key` as SGLang checks them; /health*, /ready*, /metrics*
    (and the simulator's /sim/*) never need a key."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]],
                 api_key: str | None, admin_api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_api_key = admin_api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (self.api_key or self.admin_api_key):
            path: str = scope["path"]
            if not path.startswith(OPEN_PREFIXES):
                key = self.api_key
                if path in ADMIN_PATHS and self.admin_api_key:
                    key = self.admin_api_key
                given = dict(scope["headers"]).get(b"authorization", b"")
                if key and given != b"Bearer " + key.encode():
                    await _json({"error": "Unauthorized"}, 401)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labelstr(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return "{" + ",".join(f'{k}="{esc(labels[k])}"' for k in sorted(labels)) + "}"


class _Exposition:
    """Prometheus text as prometheus_client's multiprocess collector prints it: sorted
    labels, float values, no `_created` samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: list[tuple[str, dict[str, str], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for sample, labels, value in samples:
            self.lines.append(f"{sample}{_labelstr(labels)} {_fmt(value)}")

    def histogram(self, name: str, help_text: str, hist: Histogram, base: dict[str, str],
                  label: str | None) -> None:
        samples: list[tuple[str, dict[str, str], float]] = []
        for key in sorted(hist.counts):
            labels = dict(base, **({label: key} if label else {}))
            acc = 0
            for bound, count in zip([*hist.bounds, math.inf], hist.counts[key], strict=True):
                acc += count
                samples.append((f"{name}_bucket", dict(labels, le=_fmt(bound)), acc))
            samples.append((f"{name}_count", labels, acc))
            samples.append((f"{name}_sum", labels, hist.sums[key]))
        self.family(name, "histogram", help_text, samples)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class SimServer:
    """Routes and background tasks around one SimModel."""

    def __init__(self, model: SimModel, settings: SimSettings, warmup_s: float) -> None:
        self.model = model
        self.s = settings
        self.warmup_s = warmup_s
        self.started = time.time()
        self._tasks: list[asyncio.Task[None]] = []

    # ----- lifecycle and log lines -----

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        for coro in (self.model.run(), self._warmup(), self._decode_log(), self._crash_watch()):
            self._tasks.append(asyncio.create_task(coro))
        try:
            yield
        finally:
            for task in self._tasks:
                task.cancel()

    async def _warmup(self) -> None:
        await asyncio.sleep(self.warmup_s)
        self.model.set_ready()
        log("The server is fired up and ready to roll!")

    async def _decode_log(self) -> None:
        cfg = self.model.cfg
        interval = max(0.02, cfg.wall(self.s.decode_log_interval_s))
        tags = self.s.scheduler_tags
        while True:
            await asyncio.sleep(interval)
            w = self.model.take_window()
            if w.new_seqs:  # one line sums the window's prefills (SGLang logs each batch)
                log(f"Prefill batch, #new-seq: {w.new_seqs}, #new-token: {w.new_tokens}, "
                    f"#cached-token: {w.cached_tokens}, token usage: {w.token_usage:.2f}, "
                    f"#running-req: {w.running}, #queue-req: {w.queued}, #pending-token: 0, "
                    f"cuda graph: False, input throughput (token/s): {w.input_throughput:.2f}",
                    tags)
            if not w.tokens:
                continue
            if self.s.hybrid_log:
                mamba_size = 3 * cfg.max_running_requests
                tokens = (f"#full token: {w.used_tokens}, full token usage: "
                          f"{w.token_usage:.2f}, mamba num: {w.running}, mamba usage: "
                          f"{w.running / mamba_size:.2f}")
            else:
                tokens = f"#token: {w.used_tokens}, token usage: {w.token_usage:.2f}"
            spec = (f"accept len: {w.accept_length:.2f}, accept rate: {w.accept_rate:.2f}, "
                    if cfg.spec else "")
            log(f"Decode batch, #running-req: {w.running}, {tokens}, {spec}cuda graph: True, "
                f"gen throughput (token/s): {w.gen_throughput:.2f}, #queue-req: {w.queued}",
                tags)

    async def _crash_watch(self) -> None:
        while True:
            deadline = self.model.crash_deadline
            now = self.model.clock()
            if deadline is not None and now >= deadline:
                self.crash(f"crash_after_seconds={self.model.cfg.faults.crash_after_seconds}")
            # /sim/faults may set or move the deadline at any time: look again soon
            await asyncio.sleep(0.1 if deadline is None else min(0.1, max(0.001,
                                                                          deadline - now)))

    def crash(self, why: str) -> None:
        log("Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access "
            f"was encountered (simulated fault: {why})", self.s.scheduler_tags)
        os._exit(1)

    # ----- shared pieces of the generation endpoints -----

    async def _fault(self, fault: str | None, request: Request,
                     error: Callable[[str, int], Response]) -> Response | None:
        """The response a drawn fault gives, or None to answer normally ("empty" too)."""
        if fault == "crash":
            self.crash(f"crash_after_requests={self.model.cfg.faults.crash_after_requests}")
        if fault == "error":
            return error("Internal server error: simulated fault (error_rate)", 500)
        if fault == "garbage":
            return Response(b"\x00\x01<html>simulated garbage, not JSON {\"choices\": [",
                            media_type="application/json")
        if fault == "hang":
            while not await request.is_disconnected():
                await asyncio.sleep(0.2)
            return Response(status_code=499)
        return None

    async def _wait(self, req: SimRequest, request: Request) -> None:
        """Wait for the end; abort it when the client goes away, as SGLang does."""
        while not req.done.is_set():
            try:
                await asyncio.wait_for(req.done.wait(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    self.model.abort(req.rid, message="Abort: client disconnected")

    def _spec(self, req: SimRequest) -> dict[str, Any]:
        n, verify = req.generated, req.verify_ct
        steps = self.model.cfg.spec_num_steps
        correct = max(0, n - verify)
        return {"spec_verify_ct": verify,
                "spec_accept_length": n / verify if verify else 0.0,
                "spec_accept_rate": correct / (verify * steps) if verify else 0.0,
                "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": verify * steps}

    def _finish_dict(self, req: SimRequest) -> dict[str, Any] | None:
        if req.finish == "stop":
            return {"type": "stop", "matched": EOS_TOKEN_ID}
        if req.finish == "length":
            return {"type": "length", "length": req.generated}
        if req.finish == "abort":
            return {"type": "abort", "message": req.abort_message}
        return None

    def _meta(self, req: SimRequest) -> dict[str, Any]:
        end = req.finished_at if req.finished_at is not None else self.model.clock()
        meta: dict[str, Any] = {
            "id": req.rid, "finish_reason": self._finish_dict(req),
            "prompt_tokens": req.prompt_tokens, "completion_tokens": req.generated,
            "reasoning_tokens": req.plan.reasoning_tokens_at(req.generated),
            "cached_tokens": req.cached_tokens, "e2e_latency": end - req.created,
            "weight_version": WEIGHT_VERSION, "num_retractions": 0}
        if self.model.cfg.spec:
            meta.update(self._spec(req))
        return meta

    def _usage(self, req: SimRequest) -> dict[str, Any]:
        n = req.generated
        reasoning = req.plan.reasoning_tokens_at(n)
        return {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + n,
                "completion_tokens": n,
                "prompt_tokens_details": ({"cached_tokens": req.cached_tokens}
                                          if self.s.enable_cache_report else None),
                "reasoning_tokens": reasoning,
                "completion_tokens_details": ({"reasoning_tokens": reasoning}
                                              if reasoning > 0 else None)}

    def _openai_finish(self, req: SimRequest) -> tuple[str, int | None]:
        if req.finish == "stop":
            tool = req.plan.tool_name is not None and req.generated >= req.plan.n_tokens
            return ("tool_calls" if tool else "stop"), EOS_TOKEN_ID
        return str(req.finish), None

    def _tool_calls(self, req: SimRequest) -> list[dict[str, Any]]:
        return [{"id": f"call_{req.rid[:24]}", "index": 0, "type": "function",
                 "function": {"name": req.plan.tool_name,
                              "arguments": req.plan.tool_arguments}}]

    def _extras(self, out: dict[str, Any], req: SimRequest, body: dict[str, Any]) -> None:
        if body.get("return_spec_tokens_details") and self.model.cfg.spec:
            out["sglext"] = {"spec_tokens_details": self._spec(req)}

    def _submit(self, body: dict[str, Any], prompt: str | None, prompt_tokens: int,
                max_tokens: int | None, thinking: bool, fault: str | None,
                tools: list[Any] | None = None) -> SimRequest:
        rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
        cached = self.model.cached_prefix_tokens(prompt) if prompt else 0
        cached = min(cached, prompt_tokens - 1)
        params = body.get("sampling_params")
        ignore_eos = bool((params if isinstance(params, dict) else body).get("ignore_eos"))
        plan = self.model.plan_output(max_tokens, prompt_tokens, thinking, tools,
                                      empty=fault == "empty", ignore_eos=ignore_eos)
        return self.model.submit(str(rid), plan, prompt_tokens, cached,
                                 bool(body.get("stream")))

    async def _generation(self, request: Request, error: Callable[[str, int], Response],
                          handle: Callable[[Request, dict[str, Any], str | None],
                                           Awaitable[Response]]) -> Response:
        """Common frame: parse, count in /sim/state, meet faults, then `handle`."""
        body = await _read_json(request)
        if isinstance(body, str):
            return error(body, 400)
        max_tokens = (_opt_int(body.get("max_completion_tokens"))
                      or _opt_int(body.get("max_tokens")))
        if request.url.path == "/generate":
            params = body.get("sampling_params")
            max_tokens = _opt_int(params.get("max_new_tokens")) if isinstance(params,
                                                                              dict) else None
        fault = self.model.begin_request(max_tokens)
        streaming = False
        try:
            early = await self._fault(fault, request, error)
            if early is not None:
                return early
            response = await handle(request, body, fault)
            streaming = isinstance(response, StreamingResponse)
            return response
        finally:
            if not streaming:
                self.model.end_request()

    async def _stream(self, req: SimRequest, chunks: Iterator[bytes] | None,
                      steps: Callable[[int, int], Iterator[bytes]],
                      tail: Callable[[], Iterator[bytes]]) -> AsyncIterator[bytes]:
        """Drive an SSE stream: `steps(a, b)` renders tokens [a, b), `tail()` the end."""
        try:
            for c in chunks or ():
                yield c
            sent = 0
            step = max(1, round(req.plan.accept_length))
            while True:
                while sent < req.generated:
                    nxt = min(req.generated, sent + step)
                    for c in steps(sent, nxt):
                        yield c
                    sent = nxt
                if req.done.is_set():
                    break
                req.changed.clear()
                if req.generated == sent:
                    await req.changed.wait()
            for c in tail():
                yield c
            yield b"data: [DONE]\n\n"
        finally:
            if not req.done.is_set():
                self.model.abort(req.rid, message="Abort: client disconnected")
            self.model.end_request()

    # ----- the generation endpoints -----

    async def chat(self, request: Request) -> Response:
        return await self._generation(request, _openai_error, self._chat)

    async def _chat(self, request: Request, body: dict[str, Any],
                    fault: str | None) -> Response:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _openai_error("messages: Field required (a non-empty list)", 400)
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        if body.get("tool_choice") == "none":
            tools = None
        parts = [msgspec.json.encode(tools).decode()] if tools else []
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                if isinstance(content, list):
                    content = "".join(str(p.get("text", "")) for p in content
                                      if isinstance(p, dict))
                parts.append(f"<|im_start|>{m.get('role')}\n{content or ''}<|im_end|>\n")
        prompt = "".join(parts) + "<|im_start|>assistant\n"
        kwargs = body.get("chat_template_kwargs")
        thinking = True
        if isinstance(kwargs, dict):
            thinking = bool(kwargs.get("enable_thinking", kwargs.get("thinking", True)))
        max_tokens = (_opt_int(body.get("max_completion_tokens"))
                      or _opt_int(body.get("max_tokens")))
        req = self._submit(body, prompt, estimate_tokens(prompt), max_tokens, thinking, fault,
                           tools)
        split = (self.s.reasoning_parser not in (None, "none")
                 and body.get("separate_reasoning", True) is not False)
        bank = self.model.bank
        base = {"id": req.rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.s.served_model_name}

        if body.get("stream"):
            def chunk(delta: dict[str, Any], finish: str | None = None,
                      matched: int | None = None) -> bytes:
                return _sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                   "finish_reason": finish,
                                                   "matched_stop": matched}],
                             "usage": None})

            def steps(a: int, b: int) -> Iterator[bytes]:
                p = bank.pieces(req.plan, a, b)
                if split and req.plan.thinking:
                    if p.reasoning:
                        yield chunk({"reasoning_content": p.reasoning})
                    if p.content:
                        yield chunk({"content": p.content})
                elif p.raw:
                    yield chunk({"content": p.raw})

            def tail() -> Iterator[bytes]:
                finish, matched = self._openai_finish(req)
                if finish == "tool_calls":
                    yield chunk({"tool_calls": self._tool_calls(req)})
                last: dict[str, Any] = {**base, "choices": [
                    {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish,
                     "matched_stop": matched}], "usage": None}
                self._extras(last, req, body)
                yield _sse(last)
                options = body.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):
                    yield _sse({**base, "choices": [], "usage": self._usage(req)})

            first = chunk({"role": "assistant", "content": ""})
            return StreamingResponse(self._stream(req, iter([first]), steps, tail),
                                     media_type=SSE)

        await self._wait(req, request)
        piece = bank.pieces(req.plan, 0, req.generated)
        finish, matched = self._openai_finish(req)
        if split and req.plan.thinking:
            content, reasoning = piece.content, piece.reasoning
        else:
            content, reasoning = piece.raw, None
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content,
                        "reasoning_content": reasoning,
                        "tool_calls": self._tool_calls(req) if finish == "tool_calls" else None},
            "logprobs": None, "finish_reason": finish, "matched_stop": matched}
        if body.get("return_meta_info"):
            choice["meta_info"] = self._meta(req)
        out: dict[str, Any] = {"id": req.rid, "object": "chat.completion",
                               "created": base["created"], "model": self.s.served_model_name,
                               "choices": [choice], "usage": self._usage(req),
                               "metadata": {"weight_version": WEIGHT_VERSION}}
        self._extras(out, req, body)
        return _json(out)

    async def completions(self, request: Request) -> Response:
        return await self._generation(request, _openai_error, self._completions)

    async def _completions(self, request: Request, body: dict[str, Any],
                           fault: str | None) -> Response:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if prompt and all(isinstance(t, int) for t in prompt):
                text, tokens = None, len(prompt)
            else:
                text = "".join(str(p) for p in prompt)
                tokens = estimate_tokens(text)
        elif isinstance(prompt, str):
            text, tokens = prompt, estimate_tokens(prompt)
        else:
            return _openai_error("prompt: Field required", 400)
        thinking = text is None or "</think>" not in text[-48:]
        max_tokens = _opt_int(body.get("max_tokens"))
        max_tokens = 16 if max_tokens is None else max_tokens  # CompletionRequest's default
        req = self._submit(body, text, tokens, max_tokens, thinking, fault)
        bank = self.model.bank
        base = {"id": req.rid, "object": "text_completion", "created": int(time.time()),
                "model": self.s.served_model_name}

        def choice(text: str, finish: str | None, matched: int | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                    "matched_stop": matched}

        if body.get("stream"):
            def steps(a: int, b: int) -> Iterator[bytes]:
                text = bank.pieces(req.plan, a, b).full
                if text:
                    yield _sse({**base, "choices": [choice(text, None, None)], "usage": None})

            def tail() -> Iterator[bytes]:
                finish, matched = self._openai_finish(req)
                last: dict[str, Any] = {**base, "choices": [choice("", finish, matched)],
                                        "usage": None}
                self._extras(last, req, body)
                yield _sse(last)
                options = body.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):
                    yield _sse({**base, "choices": [], "usage": self._usage(req)})

            return StreamingResponse(self._stream(req, None, steps, tail), media_type=SSE)

        await self._wait(req, request)
        finish, matched = self._openai_finish(req)
        one = choice(bank.pieces(req.plan, 0, req.generated).full, finish, matched)
        if body.get("return_meta_info"):
            one["meta_info"] = self._meta(req)
        out: dict[str, Any] = {**base, "choices": [one], "usage": self._usage(req),
                               "metadata": {"weight_version": WEIGHT_VERSION}}
        self._extras(out, req, body)
        return _json(out)

    async def generate(self, request: Request) -> Response:
        return await self._generation(request, _native_error, self._generate)

    async def _generate(self, request: Request, body: dict[str, Any],
                        fault: str | None) -> Response:
        params = body.get("sampling_params")
        params = params if isinstance(params, dict) else {}
        max_new = _opt_int(params.get("max_new_tokens"))
        max_new = 128 if max_new is None else max_new
        texts = body.get("text")
        ids = body.get("input_ids")
        if isinstance(texts, list) and not body.get("stream"):
            subs = [dict(body, text=t, rid=None) for t in texts]
            reqs = [self._native_request(b, max_new, fault) for b in subs]
            for r in reqs:
                await self._wait(r, request)
            return _json([self._native_body(r) for r in reqs])
        if isinstance(texts, list):
            return _native_error("The simulator does not stream batch requests.", 400)
        if not isinstance(texts, str) and not isinstance(ids, list):
            return _native_error("Either text or input_ids should be provided.", 400)
        req = self._native_request(body, max_new, fault)
        if not body.get("stream"):
            await self._wait(req, request)
            return _json(self._native_body(req))
        bank = self.model.bank
        state = {"text": ""}

        def steps(a: int, b: int) -> Iterator[bytes]:
            state["text"] += bank.pieces(req.plan, a, b).full
            meta = self._meta(req)
            meta["finish_reason"] = None
            meta["completion_tokens"] = b
            yield _sse({"text": state["text"], "output_ids": bank.ids_at(req.plan.offset, b),
                        "meta_info": meta})

        def tail() -> Iterator[bytes]:
            yield _sse(self._native_body(req))

        return StreamingResponse(self._stream(req, None, steps, tail), media_type=SSE)

    def _native_request(self, body: dict[str, Any], max_new: int,
                        fault: str | None) -> SimRequest:
        text = body.get("text")
        if isinstance(text, str):
            thinking = "</think>" not in text[-48:]
            return self._submit(body, text, estimate_tokens(text), max_new, thinking, fault)
        ids = body.get("input_ids")
        return self._submit(body, None, max(1, len(ids) if isinstance(ids, list) else 1),
                            max_new, True, fault)

    def _native_body(self, req: SimRequest) -> dict[str, Any]:
        return {"text": self.model.bank.pieces(req.plan, 0, req.generated).full,
                "output_ids": self.model.bank.ids_at(req.plan.offset, req.generated),
                "meta_info": self._meta(req)}

    # ----- health, info, load and control endpoints -----

    async def health(self, request: Request) -> Response:
        """SGLang's check: a 1-token generate through the queue; 200 once any scheduler
        output arrives after the check began (polled each second), 503 after the timeout."""
        model = self.model
        if not model.ready:
            return Response(status_code=503)
        generation = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true")
        if request.url.path == "/health" and generation.lower() in ("false", "0"):
            return Response(status_code=200)
        timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        poll = max(0.001, model.cfg.wall(1.0) if model.cfg.time_scale > 0 else 0.001)
        plan = model.plan_output(1, 1, thinking=False)
        began = model.clock()
        req = model.submit(f"HEALTH_CHECK_{uuid.uuid4().hex}", plan, 1, 0, False, health=True)
        try:
            while model.clock() < began + model.cfg.wall(timeout):
                await asyncio.sleep(poll)
                if model.last_output_at >= began:
                    return Response(status_code=200)
            return Response(status_code=503)
        finally:
            if not req.done.is_set():
                model.abort(req.rid)

    def server_args(self) -> dict[str, Any]:
        return dict(self.s.server_args)

    def server_info(self) -> dict[str, Any]:
        model, cfg = self.model, self.model.cfg
        internal = self.server_args()
        internal.update({
            "last_gen_throughput": model.last.gen_throughput,
            "effective_max_running_requests_per_dp": cfg.max_running_requests,
            "memory_usage": {"weight": 54.68, "kvcache": round(cfg.max_total_num_tokens
                                                               * 0.000131, 2),
                             "token_capacity": cfg.max_total_num_tokens, "graph": 1.52},
        })
        if cfg.spec and model.avg_spec_accept_length is not None:
            internal["avg_spec_accept_length"] = model.avg_spec_accept_length
        return {**self.server_args(), "launch_command": self.s.launch_command,
                "max_total_num_tokens": cfg.max_total_num_tokens,
                "max_req_input_len": min(cfg.context_length, cfg.max_total_num_tokens) - 1,
                "version": SGLANG_VERSION, "internal_states": [internal]}

    def loads(self, include: str | None, fmt: str | None) -> Response:
        sections = {s.strip() for s in include.split(",")} if include else {"all"}
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if sections - valid:
            return _json({"detail": f"Invalid include sections: {sections - valid}. "
                                    f"Valid options: {sorted(valid)}"}, 400)
        model, cfg = self.model, self.model.cfg
        every = "all" in sections
        load: dict[str, Any] = {"dp_rank": 0, "timestamp": time.time()}
        if every or "core" in sections:
            used = model.used_tokens()
            load.update({
                "num_running_reqs": len(model.running), "num_waiting_reqs": len(model.waiting),
                "num_used_tokens": used,
                "num_total_tokens": used + sum(r.prompt_tokens for r in model.waiting),
                "max_total_num_tokens": cfg.max_total_num_tokens,
                "token_usage": used / cfg.max_total_num_tokens,
                "gen_throughput": model.last.gen_throughput,
                "cache_hit_rate": model.last.cache_hit_rate,
                "utilization": len(model.running) / cfg.max_running_requests,
                "max_running_requests": cfg.max_running_requests})
        if (every or "memory" in sections):
            load["memory"] = {"weight_gb": 54.68, "kv_cache_gb": 65.5, "graph_gb": 1.52,
                              "token_capacity": cfg.max_total_num_tokens}
        if (every or "spec" in sections) and cfg.spec:
            load["speculative"] = {"accept_length": model.last.accept_length,
                                   "accept_rate": model.last.accept_rate}
        if fmt == "prometheus":
            lines: list[str] = []
            for key, value in load.items():
                if key == "dp_rank":
                    continue
                prefix = {"speculative": "spec"}.get(key, key)
                items = ([(f"sglang_{prefix}_{k}", v) for k, v in value.items()]
                         if isinstance(value, dict) else [(f"sglang_{key}", value)])
                for name, v in items:
                    lines += [f"# TYPE {name} gauge", f'{name}{{dp_rank="0"}} {v}']
            return Response("\n".join(lines) + "\n", media_type=PROM)
        return _json({"timestamp": datetime.now(UTC).isoformat(), "version": SGLANG_VERSION,
                      "accelerator": None, "num_accelerators": self.s.tp_size,
                      "loads": [load]})

    def metrics(self) -> str:
        model, cfg = self.model, self.model.cfg
        sched = {"engine_type": "unified", "model_name": self.s.served_model_name,
                 "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
        tok = {"engine_type": "unified", "model_name": self.s.served_model_name}
        used = model.used_tokens()
        e = _Exposition()
        gauges: list[tuple[str, str, float]] = [
            ("num_running_reqs", "The number of running requests.", len(model.running)),
            ("num_queue_reqs", "The number of requests in the waiting queue.",
             len(model.waiting)),
            ("gen_throughput", "The generation throughput (token/s).",
             model.last.gen_throughput),
            ("cache_hit_rate", "The prefix cache hit rate.", model.last.cache_hit_rate),
            ("token_usage", "The token usage.", used / cfg.max_total_num_tokens),
            ("num_used_tokens", "The number of used tokens.", used),
            ("kv_available_tokens", "The number of available KV cache tokens.",
             cfg.max_total_num_tokens - used),
            ("mamba_usage", "The usage of the mamba state pool.",
             len(model.running) / (3 * cfg.max_running_requests) if self.s.hybrid_log else 0),
            ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
             cfg.max_total_num_tokens),
            ("utilization", "The utilization.", len(model.running) / cfg.max_running_requests),
        ]
        if cfg.spec:
            gauges += [
                ("spec_accept_length", "Mean acceptance length of speculative decoding "
                 "(accepted drafts + bonus token per forward).", model.last.accept_length),
                ("spec_accept_rate", "Acceptance rate of speculative decoding (accepted "
                 "drafts / proposed drafts).", model.last.accept_rate),
                ("spec_num_steps", "The number of speculative decoding steps.",
                 cfg.spec_num_steps),
                ("spec_num_draft_tokens", "The number of speculative draft tokens.",
                 cfg.spec_num_draft_tokens)]
        for name, text, value in gauges:
            e.family(f"sglang:{name}", "gauge", text, [(f"sglang:{name}", sched, value)])

        def by_stream(counter: dict[str, int]) -> list[tuple[dict[str, str], float]]:
            return [(dict(tok, is_streaming=k), float(v)) for k, v in sorted(counter.items())]

        counters: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = [
            ("prompt_tokens_total", "Number of prefill tokens processed.",
             by_stream(model.prompt_tokens_total)),
            ("generation_tokens_total", "Number of generation tokens processed.",
             by_stream(model.generation_tokens_total)),
            ("num_requests_total", "Number of requests processed.",
             by_stream(model.num_requests_total)),
            ("num_aborted_requests_total", "Number of requests aborted.",
             [(tok, model.aborted_total)]),
            ("cached_tokens_total", "Number of cached prompt tokens.",
             [(dict(tok, cache_source="device"), model.cached_tokens_total)]),
        ]
        if cfg.spec:
            counters.append(("spec_verify_calls_total", "Number of speculative decoding "
                             "verification calls.", [(tok, model.verify_calls_total)]))
        for name, text, samples in counters:
            e.family(f"sglang:{name}", "counter", text,
                     [(f"sglang:{name}", labels, v) for labels, v in samples])
        e.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token "
                    "in seconds.", model.ttft, tok, "is_streaming")
        e.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency "
                    "in seconds.", model.itl, tok, None)
        e.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request "
                    "latency in seconds", model.e2e, tok, "is_streaming")
        e.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                    model.queue_time, sched, None)
        return e.text()

    async def set_internal_state(self, request: Request) -> Response:
        body = await _read_json(request)
        args = body.get("server_args") if isinstance(body, dict) else None
        if not isinstance(args, dict) or not args or set(args) - set(INTERNAL_STATE_KEYS):
            return _json({"updated": False, "server_args": self.server_args()})
        self.s.server_args.update(args)
        if any(k.startswith("speculative_accept_threshold") for k in args):
            self.model.reset_accept_counters()
        return _json({"updated": True, "server_args": self.server_args()})


def create_app(sim: SimServer) -> FastAPI:
    app = FastAPI(lifespan=sim.lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(AuthMiddleware, api_key=sim.s.api_key, admin_api_key=sim.s.admin_api_key)
    model = sim.model

    app.add_api_route("/health", sim.health, methods=["GET"])
    app.add_api_route("/health_generate", sim.health, methods=["GET"])
    app.add_api_route("/v1/chat/completions", sim.chat, methods=["POST"])
    app.add_api_route("/v1/completions", sim.completions, methods=["POST"])
    app.add_api_route("/generate", sim.generate, methods=["POST", "PUT"])
    app.add_api_route("/set_internal_state", sim.set_internal_state, methods=["POST", "PUT"])

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if model.ready and not model.paused else 503)

    @app.get("/server_info")
    async def server_info() -> Response:
        return _json(sim.server_info())

    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        log("Endpoint '/get_server_info' is deprecated and will be removed in a future "
            "version. Please use '/server_info' instead.")
        return _json(sim.server_info())

    def model_info_body() -> dict[str, Any]:
        return {"model_path": sim.s.model_path, "tokenizer_path": sim.s.model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": WEIGHT_VERSION, "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"]}

    @app.get("/model_info")
    async def model_info() -> Response:
        return _json(model_info_body())

    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        log("Endpoint '/get_model_info' is deprecated and will be removed in a future "
            "version. Please use '/model_info' instead.")
        return _json(model_info_body())

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [
            {"id": sim.s.served_model_name, "object": "model", "created": int(sim.started),
             "owned_by": "sglang", "root": sim.s.model_path,
             "max_model_len": model.cfg.context_length}]})

    if sim.s.enable_metrics:
        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(sim.metrics(), media_type=PROM)

    @app.get("/v1/loads")
    async def loads(include: str | None = None, format: str | None = None) -> Response:
        return sim.loads(include, format)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = model.flush_cache()
        return Response(FLUSH_TEXT, status_code=200 if ok else 400, media_type="text/plain")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await _read_json(request)
        if isinstance(body, dict):
            rid = body.get("rid")
            model.abort(rid if isinstance(rid, str) else None, bool(body.get("abort_all")))
        return Response(status_code=200)

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        body = await _read_json(request) if await request.body() else {}
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in ("abort", "retract", "in_place"):
            return _json({"error": {"message": f"Invalid pause mode {mode!r}"}}, 400)
        model.pause(str(mode))
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        model.resume()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    @app.get("/sim/state")
    async def sim_state() -> Response:
        return _json(model.state())

    @app.get("/sim/faults")
    async def get_faults() -> Response:
        return _json(model.cfg.faults.as_dict())

    @app.post("/sim/faults")
    async def set_faults(request: Request) -> Response:
        body = await _read_json(request)
        if isinstance(body, str):
            return _json({"error": body}, 400)
        try:
            model.set_faults(body)
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        return _json(model.cfg.faults.as_dict())

    return app
