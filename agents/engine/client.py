"""One SGLang server as the engine sees it: a reused httpx client, the chat request, and
the response parsed into batch line fields, with failures sorted into error classes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from agents.engine.prompts import Prompt


class RequestFailed(Exception):
    """A request that did not produce a completion. `error` is the class in failures.jsonl."""

    def __init__(self, error: str, message: str, retryable: bool, server_fault: bool) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message
        self.retryable = retryable
        # True when the failure says something about the server (counts towards setting it aside)
        self.server_fault = server_fault


class Aborted(RequestFailed):
    """A 200 whose finish_reason is "abort"."""


DUPLICATE_RID = b"Duplicate request ID"


@dataclass(slots=True)
class Completion:
    reasoning_content: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    spec_verify_ct: int | None
    latency_s: float


def make_client(url: str, max_connections: int, connect_timeout: float, read_timeout: float,
                api_key: str | None) -> httpx.AsyncClient:
    # httpx's defaults (100 connections, 5 s) would turn long reasoning answers into failures.
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        base_url=url,
        headers=headers,
        timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=None),
        limits=httpx.Limits(
            max_connections=max_connections + 8,
            max_keepalive_connections=max_connections + 8,
        ),
    )


def rid_for(index: int, attempt: int) -> str:
    """The request id sent with every request: which line and attempt it is for, so that
    `/abort_request` can name it (a hedge's copies share it; they go to different servers)."""
    return f"{index}:{attempt}"


def build_request(prompt: Prompt, model: str, max_tokens: int, sampling: dict[str, Any],
                  chat_template_kwargs: dict[str, Any], rid: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": prompt.messages,
        "max_tokens": max_tokens,
        "stream": False,
        "separate_reasoning": True,
        "return_spec_tokens_details": True,
    }
    body.update(sampling)
    if prompt.tools:
        body["tools"] = prompt.tools
    if chat_template_kwargs:
        body["chat_template_kwargs"] = chat_template_kwargs
    if rid is not None:
        body["rid"] = rid
    return body


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def parse_response(status: int, body: bytes, latency_s: float) -> Completion:
    if status >= 500:
        raise RequestFailed(f"http_{status}", body[:300].decode(errors="replace"), True, True)
    if status in (408, 429) or (status == 400 and DUPLICATE_RID in body[:300]):
        # SGLang refuses a rid it still holds (a copy not yet gone after its abort): later.
        raise RequestFailed(f"http_{status}", body[:300].decode(errors="replace"), True, False)
    if status >= 400:
        raise RequestFailed(f"http_{status}", body[:300].decode(errors="replace"), False, False)
    try:
        return _completion(msgspec.json.decode(body), latency_s)
    except Aborted:
        raise
    except (msgspec.DecodeError, KeyError, IndexError, TypeError, AttributeError,
            ValueError) as exc:
        # A 200 whose body is not a chat completion (garbage, a proxy's page, a wrong shape).
        snippet = body[:120].decode(errors="replace")
        raise RequestFailed("bad_response", f"{type(exc).__name__}: {snippet!r}",
                            True, True) from None


def _dict(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not an object")
    return value


def _completion(obj: Any, latency_s: float) -> Completion:
    choice = _dict(obj["choices"][0], "choices[0]")
    message = _dict(choice["message"], "message")
    usage = _dict(obj.get("usage"), "usage")
    finish = choice.get("finish_reason") or "stop"
    if isinstance(finish, dict):  # native /generate shape, tolerated
        finish = finish.get("type", "stop")
    if finish == "abort":
        # Aborted on the server (/abort_request, pause_generation): not an answer.
        raise Aborted("aborted", "the server aborted the request (finish_reason abort)",
                      True, False)
    details = _dict(usage.get("completion_tokens_details"), "completion_tokens_details")
    reasoning_tokens = _int(usage.get("reasoning_tokens")) or _int(details.get("reasoning_tokens"))
    spec = _dict(_dict(obj.get("sglext"), "sglext").get("spec_tokens_details"), "sglext")
    if not spec:
        spec = _dict(choice.get("meta_info"), "meta_info")
    verify = spec.get("spec_verify_ct")
    content, reasoning = message.get("content"), message.get("reasoning_content")
    if not isinstance(content, str | None) or not isinstance(reasoning, str | None):
        raise TypeError("content or reasoning_content is not a string")
    tool_calls = message.get("tool_calls") or None
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise TypeError("tool_calls is not a list")
    return Completion(
        reasoning_content=reasoning,
        content=content,
        tool_calls=tool_calls,
        finish_reason=str(finish),
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        reasoning_tokens=reasoning_tokens,
        spec_verify_ct=_int(verify) if verify is not None else None,
        latency_s=latency_s,
    )


async def chat(client: httpx.AsyncClient, payload: dict[str, Any]) -> Completion:
    start = time.monotonic()
    try:
        resp = await client.post("/v1/chat/completions", content=msgspec.json.encode(payload),
                                 headers={"Content-Type": "application/json"})
    except httpx.ConnectError as exc:
        raise RequestFailed("connect", str(exc) or "connection refused", True, True) from None
    except httpx.TimeoutException as exc:
        raise RequestFailed("timeout", f"{type(exc).__name__} after "
                            f"{time.monotonic() - start:.1f} s", True, True) from None
    except httpx.TransportError as exc:
        raise RequestFailed("transport", f"{type(exc).__name__}: {exc}", True, True) from None
    return parse_response(resp.status_code, resp.content, time.monotonic() - start)


async def abort(client: httpx.AsyncClient, rid: str, admin_api_key: str | None,
                timeout: float = 5.0) -> int | None:
    """SGLang's `POST /abort_request {"rid": RID}` (`AbortReq`; auth level ADMIN_OPTIONAL:
    the admin key when the server has one, else its API key, which the client sends). The
    HTTP status, or None when the server could not be reached; best effort: 200 also for a
    rid the server no longer holds."""
    headers = {"Content-Type": "application/json"}
    if admin_api_key:
        headers["Authorization"] = f"Bearer {admin_api_key}"
    try:
        resp = await client.post("/abort_request", content=msgspec.json.encode({"rid": rid}),
                                 headers=headers, timeout=timeout)
    except (httpx.HTTPError, RuntimeError):  # RuntimeError: the client closed (engine ends)
        return None
    return resp.status_code


async def probe(client: httpx.AsyncClient, timeout: float) -> bool:
    """A server answers again when /health says 200."""
    try:
        resp = await client.get("/health", timeout=timeout)
    except httpx.HTTPError:
        return False
    return resp.status_code == 200
