"""The SGLang simulator's generation endpoints: OpenAI chat and completions and native
/generate, whole or as SSE streams, shaped as SGLang 0.5.x answers them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from agents.sim.faults import crash
from agents.sim.metainfo import MetaInfo
from agents.sim.model import SimModel, SimRequest
from agents.sim.output import estimate_tokens
from agents.sim.settings import SimSettings

SSE = "text/event-stream"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


def _sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def _openai_error(message: str, status: int, kind: str = "BadRequestError") -> Response:
    return json_response({"object": "error", "message": message, "type": kind,
                          "param": None, "code": status}, status)


def _native_error(message: str, status: int) -> Response:
    return json_response({"error": {"message": message}}, status)


def _refusal(req: SimRequest) -> Response | None:
    """An abort that carries an HTTP status (a full queue 503, no KV room 500) answers as
    SGLang's HTTPException handler does, on every route: an OpenAI-style error whose type is
    the status as text (tokenizer_manager.py, http_server.py)."""
    status = req.abort_status
    if req.finish != "abort" or status is None:
        return None
    return json_response({"object": "error", "message": req.abort_message,
                          "type": str(status), "param": None, "code": status}, status)


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


async def read_json(request: Request) -> dict[str, Any] | str:
    """The JSON object body, or why there is none."""
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype:
        return f"Content-Type must be application/json, not {ctype!r}"
    try:
        obj = msgspec.json.decode(await request.body())
    except msgspec.DecodeError as exc:
        return f"Invalid JSON body: {exc}"
    return obj if isinstance(obj, dict) else "The JSON body must be an object"


class Refused(Exception):
    """A request SGLang refuses before it is queued (HTTP 400); the message is SGLang's."""


class Generation:
    """The generation routes around one SimModel: /v1/chat/completions, /v1/completions
    and /generate."""

    def __init__(self, model: SimModel, settings: SimSettings) -> None:
        self.model = model
        self.s = settings
        self.info = MetaInfo(model, settings)

    # ----- shared pieces of the generation endpoints -----

    async def _answer_fault(self, fault: str | None, request: Request,
                            error: Callable[[str, int], Response]) -> Response | None:
        """The response a drawn fault gives, or None to answer normally ("empty" too)."""
        if fault == "crash":
            crash(f"crash_after_requests={self.model.cfg.faults.crash_after_requests}",
                  self.s.scheduler_tags)
        if fault == "error":
            status = self.model.cfg.faults.error_status
            what = "Internal server error" if status == 500 else f"HTTP {status}"
            return error(f"{what}: simulated fault (error_rate)", status)
        if fault == "garbage":
            return Response(b"\x00\x01<html>simulated garbage, not JSON {\"choices\": [",
                            media_type="application/json")
        return None  # "empty" and "hang" are answered by the model (a hung request is held)

    async def _wait(self, req: SimRequest, request: Request) -> None:
        """Wait for the end; abort it when the client goes away, as SGLang does."""
        while not req.done.is_set():
            try:
                await asyncio.wait_for(req.done.wait(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    self.model.abort(req.rid, message="Abort: client disconnected")

    def _check_length(self, prompt_tokens: int, max_tokens: int | None) -> None:
        """SGLang's two length checks (tokenizer_manager.py `_validate_one_request`)."""
        context = self.model.cfg.context_length
        if prompt_tokens >= context:
            raise Refused(f"The input ({prompt_tokens} tokens) is longer than the model's "
                          f"context length ({context} tokens).")
        if max_tokens is not None and prompt_tokens + max_tokens > context:
            raise Refused(
                "Requested token count exceeds the model's maximum context length of "
                f"{context} tokens. You requested a total of {prompt_tokens + max_tokens} "
                f"tokens: {prompt_tokens} tokens from the input messages and {max_tokens} "
                "tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit.")

    def _model_name(self, body: dict[str, Any]) -> str:
        """The `model` an OpenAI answer names: the request's own, as SGLang echoes it."""
        model = body.get("model")
        return model if isinstance(model, str) and model else self.s.served_model_name

    def _extras(self, out: dict[str, Any], req: SimRequest, body: dict[str, Any]) -> None:
        if body.get("return_spec_tokens_details") and self.model.cfg.spec:
            out["sglext"] = {"spec_tokens_details": self.info.spec(req)}

    def _submit(self, body: dict[str, Any], prompt: str | None, prompt_tokens: int,
                max_tokens: int | None, thinking: bool, fault: str | None,
                tools: list[Any] | None = None) -> SimRequest:
        rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
        self._check_length(prompt_tokens, max_tokens)
        cached = self.model.cached_prefix_tokens(prompt) if prompt else 0
        cached = min(cached, prompt_tokens - 1)
        params = body.get("sampling_params")
        ignore_eos = bool((params if isinstance(params, dict) else body).get("ignore_eos"))
        # The answer is the prompt's (token ids stand for the text they encode).
        key = prompt if prompt is not None else msgspec.json.encode(
            body.get("input_ids") or body.get("prompt")).decode()
        plan = self.model.plan_output(max_tokens, prompt_tokens, thinking, tools,
                                      empty=fault == "empty", ignore_eos=ignore_eos,
                                      prompt=key)
        return self.model.submit(str(rid), plan, prompt_tokens, cached,
                                 bool(body.get("stream")), hung=fault == "hang",
                                 max_new=max_tokens, ignore_eos=ignore_eos)

    async def _generation(self, request: Request, error: Callable[[str, int], Response],
                          handle: Callable[[Request, dict[str, Any], str | None],
                                           Awaitable[Response]]) -> Response:
        """Common frame: parse, count in /sim/state, meet faults, then `handle`."""
        body = await read_json(request)
        if isinstance(body, str):
            return error(body, 400)
        max_tokens = (_opt_int(body.get("max_completion_tokens"))
                      or _opt_int(body.get("max_tokens")))
        if request.url.path == "/generate":
            params = body.get("sampling_params")
            max_tokens = _opt_int(params.get("max_new_tokens")) if isinstance(params,
                                                                              dict) else None
        rid = body.get("rid")
        if isinstance(rid, str) and self.model.holds(rid):
            # SGLang's tokenizer manager refuses a rid it still holds (a ValueError -> 400).
            return error(f"Duplicate request ID detected: {rid}", 400)
        fault = self.model.begin_request(max_tokens)
        streaming = False
        try:
            early = await self._answer_fault(fault, request, error)
            if early is not None:
                return early
            try:
                response = await handle(request, body, fault)
            except Refused as exc:  # SGLang's tokenizer manager raises ValueError: a 400
                return error(str(exc), 400)
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
            # a request validation error: SGLang's handler names its type "Bad Request"
            return _openai_error("messages: Field required (a non-empty list)", 400,
                                 "Bad Request")
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
                "model": self._model_name(body)}

        if body.get("stream"):
            # Without a reasoning parser every delta says reasoning_content null (0.5.23).
            lead: dict[str, Any] = {} if split else {"reasoning_content": None}

            def chunk(delta: dict[str, Any], finish: str | None = None,
                      matched: int | None = None) -> bytes:
                return _sse({**base, "choices": [{"index": 0, "delta": {**lead, **delta},
                                                   "logprobs": None, "finish_reason": finish,
                                                   "matched_stop": matched}]})

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
                finish, matched = self.info.openai_finish(req)
                if finish == "tool_calls":
                    yield chunk({"tool_calls": self.info.tool_calls(req)})
                last: dict[str, Any] = {**base, "choices": [
                    {"index": 0, "delta": dict(lead), "logprobs": None,
                     "finish_reason": finish, "matched_stop": matched}]}
                self._extras(last, req, body)
                yield _sse(last)
                options = body.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):
                    yield _sse({**base, "choices": [], "usage": self.info.usage(req)})

            first = chunk({"role": "assistant", "content": ""})
            return StreamingResponse(self._stream(req, iter([first]), steps, tail),
                                     media_type=SSE)

        await self._wait(req, request)
        if (refusal := _refusal(req)) is not None:
            return refusal
        piece = bank.pieces(req.plan, 0, req.generated)
        finish, matched = self.info.openai_finish(req)
        if split and req.plan.thinking:
            content, reasoning = piece.content, piece.reasoning
        else:
            content, reasoning = piece.raw, None
        message: dict[str, Any] = {"role": "assistant", "content": content,
                                   "reasoning_content": reasoning}
        if finish == "tool_calls":  # SGLang leaves the key out when there is no call
            message["tool_calls"] = self.info.tool_calls(req)
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                  "finish_reason": finish, "matched_stop": matched}
        if body.get("return_meta_info"):
            choice["meta_info"] = self.info.meta(req)
        out: dict[str, Any] = {"id": req.rid, "object": "chat.completion",
                               "created": base["created"], "model": base["model"],
                               "choices": [choice], "usage": self.info.usage(req),
                               "metadata": self.info.metadata(req)}
        self._extras(out, req, body)
        return json_response(out)

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
            return _openai_error("prompt: Field required", 400, "Bad Request")
        thinking = text is None or "</think>" not in text[-48:]
        max_tokens = _opt_int(body.get("max_tokens"))
        max_tokens = 16 if max_tokens is None else max_tokens  # CompletionRequest's default
        req = self._submit(body, text, tokens, max_tokens, thinking, fault)
        bank = self.model.bank
        base = {"id": req.rid, "object": "text_completion", "created": int(time.time()),
                "model": self._model_name(body)}

        def choice(text: str, finish: str | None, matched: int | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                    "matched_stop": matched}

        if body.get("stream"):
            def steps(a: int, b: int) -> Iterator[bytes]:
                text = bank.pieces(req.plan, a, b).full
                if text:
                    yield _sse({**base, "choices": [choice(text, None, None)]})

            def tail() -> Iterator[bytes]:
                finish, matched = self.info.openai_finish(req)
                last: dict[str, Any] = {**base, "choices": [choice("", finish, matched)]}
                self._extras(last, req, body)
                yield _sse(last)
                options = body.get("stream_options")
                if isinstance(options, dict) and options.get("include_usage"):
                    yield _sse({**base, "choices": [], "usage": self.info.usage(req)})

            return StreamingResponse(self._stream(req, None, steps, tail), media_type=SSE)

        await self._wait(req, request)
        if (refusal := _refusal(req)) is not None:
            return refusal
        finish, matched = self.info.openai_finish(req)
        one = choice(bank.pieces(req.plan, 0, req.generated).full, finish, matched)
        if body.get("return_meta_info"):
            one["meta_info"] = self.info.meta(req)
        out: dict[str, Any] = {**base, "choices": [one], "usage": self.info.usage(req),
                               "metadata": self.info.metadata(req)}
        self._extras(out, req, body)
        return json_response(out)

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
            return json_response([self._native_body(r) for r in reqs])
        if isinstance(texts, list):
            return _native_error("The simulator does not stream batch requests.", 400)
        if not isinstance(texts, str) and not isinstance(ids, list):
            return _native_error("Either text or input_ids should be provided.", 400)
        req = self._native_request(body, max_new, fault)
        if not body.get("stream"):
            await self._wait(req, request)
            return _refusal(req) or json_response(self._native_body(req))
        bank = self.model.bank
        state = {"text": ""}

        def steps(a: int, b: int) -> Iterator[bytes]:
            state["text"] += bank.pieces(req.plan, a, b).full
            meta = self.info.meta(req, streamed=b, first=a == 0)
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
                "meta_info": self.info.meta(req)}
