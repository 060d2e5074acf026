"""The workers behind a run's SGLang router (`[servers] router = true`): listed from the
router's `GET /workers`, each watched on its own `/health`, `/server_info` and `/metrics`, and
shown as rows of the snapshot's servers after the router's own row 0 (the engine's one
server). The router decides where requests go; these rows only say how its workers fare."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from agents.engine.router import RouterWorker, read_workers, workers_url
from agents.rundir.schema import ServerState, ServerStatus
from agents.rundir.spec import RunSpec
from agents.supervise.retractions import Retractions
from agents.supervise.servers import fetch_figures, figure_fields, unanswered
from agents.supervise.sglang_metrics import (
    ServerFigures,
    server_figures,
)

log = logging.getLogger("fleetdeck.router")

UNLISTED = "the router no longer lists this worker"
ROUTER_UNHEALTHY = "the router marks it unhealthy and sends it nothing"


@dataclass(slots=True)
class Worker:
    number: int
    url: str
    listed: bool = True  # in the router's latest /workers answer
    router_healthy: bool | None = None  # the router's own word (`is_healthy`)
    state: ServerState = "starting"
    fails_in_row: int = 0
    last_error: str | None = None
    health_checked_at: float | None = None
    metrics_at: float | None = None
    figures: ServerFigures = field(default_factory=ServerFigures)
    retractions: Retractions = field(default_factory=lambda: Retractions(300.0))
    info_paths: list[str] = field(default_factory=lambda: ["/server_info", "/get_server_info"])


def judge(worker: Worker, answered: bool, refused: bool, why: str | None,
          failures_to_down: int) -> None:
    """A worker's state after one health check. A worker the router dropped, or one it marks
    unhealthy, is down whatever it answers; a refused connection is down at once (nothing
    listens: the process is gone); other failures count, as for our own servers: the first
    makes a healthy worker degraded, `failures_to_down` in a row make it down."""
    if answered:
        worker.fails_in_row = 0
    else:
        worker.fails_in_row += 1
    state: ServerState
    error: str | None
    if not worker.listed:
        state, error = "down", UNLISTED
    elif not answered:
        error = why
        if refused or worker.fails_in_row >= failures_to_down:
            state = "down"
        elif worker.state in ("healthy", "degraded"):
            state = "degraded"
        else:
            state = worker.state
    elif worker.router_healthy is False:
        state, error = "down", ROUTER_UNHEALTHY
    else:
        state, error = "healthy", None
    if state != worker.state:
        log.info("router worker %d (%s): %s -> %s%s", worker.number, worker.url, worker.state,
                 state, f" ({error})" if error else "")
    worker.state = state
    if error is not None or state == "healthy":
        worker.last_error = error


class RouterWatch:
    """Lists the router's workers every health interval and watches each one."""

    def __init__(self, spec: RunSpec, first_number: int = 1) -> None:
        assert spec.servers.urls, "router = true needs the router's URL"
        self.cfg = spec.servers
        self.window_s = spec.alerts.window_s
        self.url = spec.servers.urls[0].rstrip("/")
        self.first_number = first_number
        self.workers: dict[str, Worker] = {}  # by URL, in the order first listed
        self.last_error: str | None = None  # the router's own: /workers not answering
        self.closed = False
        self._headers = ({"Authorization": f"Bearer {self.cfg.api_key}"}
                         if self.cfg.api_key else {})
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.cfg.health_timeout_s,
                                                               connect=5.0))
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._list_loop(), name="router-workers"))

    async def close(self) -> None:
        self.closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    # -- the router's list ------------------------------------------------------------------

    async def _list_loop(self) -> None:
        while not self.closed:
            await self.list_once()
            await asyncio.sleep(self.cfg.health_interval_s)

    async def list_once(self) -> None:
        target = workers_url(self.url)
        try:
            resp = await self._client.get(target, headers=self._headers, timeout=5.0)
            listed = read_workers(resp)
        except httpx.HTTPError as exc:
            self._router_error(f"GET {target}: {type(exc).__name__}: {exc}")
            return
        except ValueError as exc:
            self._router_error(f"GET {target} {exc}")
            return
        self.last_error = None
        self.update(listed)

    def _router_error(self, error: str) -> None:
        if error != self.last_error:
            log.warning("router %s: %s", self.url, error)
        self.last_error = error

    def update(self, listed: list[RouterWorker]) -> None:
        """The router's latest list: new workers get the next row number and a watcher;
        ones it dropped stay as rows, down, so a lost worker is seen, not forgotten."""
        seen = set()
        for rw in listed:
            url = rw.url.rstrip("/")
            seen.add(url)
            worker = self.workers.get(url)
            if worker is None:
                worker = Worker(number=self.first_number + len(self.workers), url=url,
                                retractions=Retractions(self.window_s))
                self.workers[url] = worker
                log.info("router worker %d: %s", worker.number, url)
                self._tasks.append(asyncio.create_task(self._watch(worker),
                                                       name=f"router-worker-{worker.number}"))
            worker.listed = True
            worker.router_healthy = rw.is_healthy
        for worker in self.workers.values():
            if worker.url not in seen:
                worker.listed = False

    # -- each worker ------------------------------------------------------------------------

    async def _watch(self, worker: Worker) -> None:
        figures_every = max(self.cfg.health_interval_s, 1.0)
        figures_at = 0.0
        while not self.closed:
            answered, refused, why = await self._health(worker)
            worker.health_checked_at = time.time()
            judge(worker, answered, refused, why, self.cfg.health_failures_to_down)
            if answered and time.monotonic() - figures_at >= figures_every:
                figures_at = time.monotonic()
                await self._figures(worker)
            await asyncio.sleep(self.cfg.health_interval_s)

    async def _health(self, worker: Worker) -> tuple[bool, bool, str | None]:
        """(answered 200, connection refused, what went wrong)."""
        try:
            resp = await self._client.get(f"{worker.url}/health")
        except httpx.ConnectError as exc:
            return False, True, f"GET /health: cannot connect: {exc}"
        except httpx.HTTPError as exc:
            return False, False, f"GET /health: {type(exc).__name__}: {exc}"
        if resp.status_code != 200:
            return False, False, f"GET /health answered {resp.status_code}"
        return True, False, None

    async def _figures(self, worker: Worker) -> None:
        """SGLang's own figures of one worker (sglang_metrics.server_figures): /server_info
        and /metrics; the worker's log is on its own node, out of reach."""
        try:
            info, metrics, error = await fetch_figures(self._client, worker.url,
                                                       worker.info_paths, self.cfg.api_key)
        except httpx.HTTPError as exc:
            worker.last_error = unanswered(worker.url, exc)
            return
        if error is not None:
            worker.last_error = error
        worker.figures = server_figures(info, metrics, None)
        worker.metrics_at = time.time()
        worker.retractions.add(worker.metrics_at, worker.figures)

    # -- the snapshot -----------------------------------------------------------------------

    def rows(self) -> list[ServerStatus]:
        """One row per worker the router has listed, in the order first listed."""
        out = []
        for w in self.workers.values():
            st = ServerStatus(number=w.number, url=w.url, state=w.state,
                              port=urlsplit(w.url).port, last_error=w.last_error,
                              health_checked_at=w.health_checked_at, metrics_at=w.metrics_at)
            for key, value in figure_fields(w.figures, w.retractions).items():
                setattr(st, key, value)
            out.append(st)
        return out


__all__ = ["RouterWatch", "Worker", "judge"]
