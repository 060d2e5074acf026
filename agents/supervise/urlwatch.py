"""Servers started elsewhere (`[servers] urls`, no router): the supervisor reads SGLang's own
figures of each (/server_info, /metrics) every health interval, as it does for the servers it
launches, counts their retractions, and overlays them on the engine's rows. Their health
stays the engine's word (it sends to them and sets aside one that fails); nothing here starts
or stops them, and their logs are on their own machines, out of reach."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from agents.rundir.schema import ServerStatus
from agents.rundir.spec import RunSpec
from agents.supervise.retractions import Retractions
from agents.supervise.servers import fetch_figures, figure_fields, unanswered
from agents.supervise.sglang_metrics import (
    ServerFigures,
    server_figures,
)


@dataclass(slots=True)
class UrlServer:
    number: int  # its place in [servers] urls: the engine's server number
    url: str
    retractions: Retractions
    figures: ServerFigures = field(default_factory=ServerFigures)
    metrics_at: float | None = None
    last_error: str | None = None  # the figures' own (the engine keeps its errors)
    info_answered: bool = False  # its /server_info has answered once (provenance may ask)
    info_paths: list[str] = field(default_factory=lambda: ["/server_info", "/get_server_info"])


class UrlWatch:
    def __init__(self, spec: RunSpec,
                 on_figures: Callable[[UrlServer], None] | None = None) -> None:
        self.cfg = spec.servers
        self.on_figures = on_figures
        self.servers = [UrlServer(n, url.rstrip("/"), Retractions(spec.alerts.window_s))
                        for n, url in enumerate(spec.servers.urls or [])]
        self.closed = False
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.cfg.health_timeout_s,
                                                               connect=5.0))
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for s in self.servers:
            self._tasks.append(asyncio.create_task(self._watch(s), name=f"url-server-{s.number}"))

    async def close(self) -> None:
        self.closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    async def _watch(self, server: UrlServer) -> None:
        while not self.closed:
            await self.read(server)
            await asyncio.sleep(max(self.cfg.health_interval_s, 1.0))

    async def read(self, server: UrlServer) -> None:
        """One refresh of the server's figures; a server that does not answer keeps its last
        ones (aged by metrics_at) and says why in last_error."""
        try:
            info, metrics, error = await fetch_figures(self._client, server.url,
                                                       server.info_paths, self.cfg.api_key)
        except httpx.HTTPError as exc:
            server.last_error = unanswered(server.url, exc)
            return
        server.last_error = error
        server.info_answered = server.info_answered or info is not None
        server.figures = server_figures(info, metrics, None)
        server.metrics_at = time.time()
        server.retractions.add(server.metrics_at, server.figures)
        if self.on_figures is not None:
            self.on_figures(server)

    def overlay(self, st: ServerStatus) -> None:
        """The server's own figures on its row (the engine's row: its state and counts)."""
        if not 0 <= st.number < len(self.servers):
            return
        server = self.servers[st.number]
        if server.metrics_at is None:
            st.last_error = st.last_error or server.last_error
            return
        for key, value in figure_fields(server.figures, server.retractions).items():
            setattr(st, key, value)
        st.metrics_at = server.metrics_at
        st.last_error = st.last_error or server.last_error


__all__ = ["UrlServer", "UrlWatch"]
