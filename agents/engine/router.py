"""SGLang's router (`sglang-router`) as the engine's one server: its `GET /workers` answer,
read into typed rows, and the check at launch that `[servers] router = true` points at a
router, not at a plain SGLang server (which has no /workers).

The answer of sglang-router 0.3.2 (the pinned dev dependency), as it sends it:

    {"workers": [{"id": "...", "url": "http://10.0.0.5:30000", "model_id": "Qwen/Qwen3-8B",
                  "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": true,
                  "load": 0, "connection_mode": "HTTP", "metadata": {...},
                  "disable_health_check": false}, ...],
     "total": 2, "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 2}}
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from agents.engine import EngineError


class RouterError(EngineError):
    """`router = true` but the URL does not answer as SGLang's router does."""


class RouterWorker(msgspec.Struct):
    """One worker as the router lists it; fields the router adds later are ignored."""

    url: str
    is_healthy: bool | None = None
    load: int | None = None
    model_id: str | None = None
    worker_type: str | None = None  # "regular", "prefill" or "decode"


class _WorkersAnswer(msgspec.Struct):
    workers: list[RouterWorker]
    total: int | None = None


def parse_workers(body: Any) -> list[RouterWorker]:
    """The workers of a `/workers` body; ValueError when the body is not the router's."""
    try:
        return msgspec.convert(body, _WorkersAnswer).workers
    except msgspec.ValidationError as exc:
        raise ValueError(f"not the router's answer ({exc}); expected "
                         '{"workers": [{"url": ..., "is_healthy": ...}, ...]}') from None


def workers_url(router_url: str) -> str:
    return router_url.rstrip("/") + "/workers"


def read_workers(resp: httpx.Response) -> list[RouterWorker]:
    """The workers of a router's answer to GET /workers; ValueError saying what came back
    instead (a plain SGLang server answers 404)."""
    if resp.status_code != 200:
        text = resp.text.strip().replace("\n", " ")[:200]
        raise ValueError(f"answered {resp.status_code}" + (f": {text}" if text else ""))
    try:
        body = resp.json()
    except ValueError:
        raise ValueError("answered 200 with a body that is not JSON") from None
    return parse_workers(body)


def check_router(url: str, api_key: str | None = None, timeout_s: float = 10.0,
                 where: str = "[servers] urls[0]") -> list[RouterWorker]:
    """At launch, before anything starts: `url` must answer GET /workers as SGLang's router
    does. Returns its workers; RouterError naming the URL and what it answered otherwise."""
    target = workers_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(target, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise RouterError(f"{where} {url}: router = true, but GET {target} failed: "
                          f"{type(exc).__name__}: {exc} (is the router running?)") from None
    try:
        return read_workers(resp)
    except ValueError as exc:
        raise RouterError(f"{where} {url}: router = true, but this is not SGLang's router: "
                          f"GET {target} {exc}. Point urls at the router "
                          "(python -m sglang_router.launch_router), or drop router = true "
                          "to send to this server directly") from None


__all__ = ["RouterError", "RouterWorker", "check_router", "parse_workers", "read_workers",
           "workers_url"]
