"""The SGLang simulator's HTTP app: FastAPI routes, key checks and background tasks wired
to the model, the generation endpoints (`responses.py`) and the reports (`exposition.py`)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agents.sim import exposition
from agents.sim.batchlog import decode_log
from agents.sim.faults import crash
from agents.sim.logs import log
from agents.sim.metainfo import WEIGHT_VERSION
from agents.sim.model import SimModel
from agents.sim.responses import Generation, json_response, read_json
from agents.sim.settings import SimSettings

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


class AuthMiddleware:
    """`--api-key` / `--admin-api-key` as SGLang checks them (sglang/srt/utils/auth.py,
    `decide_request_auth`): the admin paths are ADMIN_OPTIONAL there, so they take the admin
    key when the server has one (and then not the API key), else the API key, else none;
    every other path takes the API key when there is one. `Bearer` in any case. /health*,
    /ready*, /metrics* (and the simulator's /sim/*) never need a key."""

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
                scheme, _, token = given.partition(b" ")
                if key and (scheme.lower() != b"bearer" or token != key.encode()):
                    await json_response({"error": "Unauthorized"}, 401)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class SimServer:
    """Routes and background tasks around one SimModel."""

    def __init__(self, model: SimModel, settings: SimSettings, warmup_s: float) -> None:
        self.model = model
        self.s = settings
        self.warmup_s = warmup_s
        self.started = time.time()
        self.generation = Generation(model, settings)
        self._tasks: list[asyncio.Task[None]] = []

    # ----- lifecycle -----

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        tags = self.s.scheduler_tags
        self.model.log_event = lambda line: log(line, tags)
        # SGLang's own logger prints uvicorn's lines (the simulator's uvicorn is quiet).
        log(f"INFO:     Uvicorn running on http://{self.s.host}:{self.s.port} (Press CTRL+C "
            "to quit)")
        for coro in (self.model.run(), self._warmup(), decode_log(self.model, self.s),
                     self._crash_watch()):
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

    async def _crash_watch(self) -> None:
        while True:
            deadline = self.model.crash_deadline
            now = self.model.clock()
            if deadline is not None and now >= deadline:
                crash(f"crash_after_seconds={self.model.cfg.faults.crash_after_seconds}",
                      self.s.scheduler_tags)
            # /sim/faults may set or move the deadline at any time: look again soon
            await asyncio.sleep(0.1 if deadline is None else min(0.1, max(0.001,
                                                                          deadline - now)))

    # ----- health and control endpoints -----

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

    async def set_internal_state(self, request: Request) -> Response:
        body = await read_json(request)
        args = body.get("server_args") if isinstance(body, dict) else None
        if not isinstance(args, dict) or not args or set(args) - set(INTERNAL_STATE_KEYS):
            return json_response({"updated": False, "server_args": dict(self.s.server_args)})
        self.s.server_args.update(args)
        if any(k.startswith("speculative_accept_threshold") for k in args):
            self.model.reset_accept_counters()
        return json_response({"updated": True, "server_args": dict(self.s.server_args)})


def create_app(sim: SimServer) -> FastAPI:
    app = FastAPI(lifespan=sim.lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(AuthMiddleware, api_key=sim.s.api_key, admin_api_key=sim.s.admin_api_key)
    model = sim.model

    app.add_api_route("/health", sim.health, methods=["GET"])
    app.add_api_route("/health_generate", sim.health, methods=["GET"])
    app.add_api_route("/v1/chat/completions", sim.generation.chat, methods=["POST"])
    app.add_api_route("/v1/completions", sim.generation.completions, methods=["POST"])
    app.add_api_route("/generate", sim.generation.generate, methods=["POST", "PUT"])
    app.add_api_route("/set_internal_state", sim.set_internal_state, methods=["POST", "PUT"])

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if model.ready and not model.paused else 503)

    new_route = sim.s.shape.server_info_route  # /server_info from 0.5.6; 404 before

    if new_route:
        @app.get("/server_info")
        async def server_info() -> Response:
            return json_response(exposition.server_info(model, sim.s))

    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        if new_route:
            log("Endpoint '/get_server_info' is deprecated and will be removed in a future "
                "version. Please use '/server_info' instead.")
        return json_response(exposition.server_info(model, sim.s))

    def model_info_body() -> dict[str, Any]:
        # 0.5.23's body, less its `embedding` section (forty keys on embedding support)
        return {"model_path": sim.s.model_path, "served_model_name": sim.s.served_model_name,
                "tokenizer_path": sim.s.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": WEIGHT_VERSION,
                "load_format": "auto", "reasoning_parser": sim.s.reasoning_parser,
                "tool_call_parser": sim.s.server_args.get("tool_call_parser"),
                "disaggregation_mode": "null", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"]}

    @app.get("/model_info")
    async def model_info() -> Response:
        return json_response(model_info_body())

    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        log("Endpoint '/get_model_info' is deprecated and will be removed in a future "
            "version. Please use '/model_info' instead.")
        return json_response(model_info_body())

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": [
            {"id": sim.s.served_model_name, "object": "model", "created": int(sim.started),
             "owned_by": "sglang", "root": sim.s.model_path, "parent": None,
             "max_model_len": model.cfg.context_length}]})

    if sim.s.enable_metrics:
        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(exposition.metrics(model, sim.s), media_type=exposition.PROM)

    @app.get("/v1/loads")
    async def loads(include: str | None = None, format: str | None = None) -> Response:
        return exposition.loads(model, sim.s, include, format)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = model.flush_cache()
        return Response(FLUSH_TEXT, status_code=200 if ok else 400, media_type="text/plain")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        """SGLang's `AbortReq` body: {"rid": str, "abort_all": bool} (auth ADMIN_OPTIONAL, see
        AuthMiddleware). 200 with no body, also for a rid it does not hold; a body that is not
        a JSON object is a validation error (400)."""
        body = await read_json(request)
        if isinstance(body, str):
            return json_response({"object": "error", "message": body,
                                  "type": "Bad Request", "param": None, "code": 400}, 400)
        rid = body.get("rid")
        model.abort_requests += 1
        model.abort(rid if isinstance(rid, str) else None, bool(body.get("abort_all")))
        return Response(status_code=200)

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        body = await read_json(request) if await request.body() else {}
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in ("abort", "retract", "in_place"):
            return json_response({"error": {"message": f"Invalid pause mode {mode!r}"}}, 400)
        model.pause(str(mode))
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        model.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    @app.get("/sim/state")
    async def sim_state() -> Response:
        return json_response(model.state())

    @app.get("/sim/faults")
    async def get_faults() -> Response:
        return json_response(model.cfg.faults.as_dict())

    @app.post("/sim/faults")
    async def set_faults(request: Request) -> Response:
        body = await read_json(request)
        if isinstance(body, str):
            return json_response({"error": body}, 400)
        try:
            model.set_faults(body)
        except ValueError as exc:
            return json_response({"error": str(exc)}, 400)
        return json_response(model.cfg.faults.as_dict())

    return app
