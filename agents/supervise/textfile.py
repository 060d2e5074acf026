"""The run for Prometheus: `[alerts] prometheus_textfile`, written in node_exporter's textfile
format (`fleetdeck_` names: run progress, per-server rates and accept length, alerts, pages),
so the Grafana a team already runs sees the run. Replaced whole (temp file + rename): the
collector never reads half a file, and its temp name (a dot, no .prom) is not collected."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from agents.rundir.gpugroups import label
from agents.rundir.schema import Snapshot

log = logging.getLogger("fleetdeck.textfile")

# Rewritten at most this often: node_exporter reads it on its own scrape schedule.
INTERVAL_S = 10.0

# name: (type, help)
METRICS: dict[str, tuple[str, str]] = {
    "fleetdeck_run_info": ("gauge", "The run this node runs (labels), always 1."),
    "fleetdeck_run_running": ("gauge", "1 while the run's status is running or draining."),
    "fleetdeck_run_prompts": ("gauge", "Prompts the run has to answer."),
    "fleetdeck_run_completed": ("gauge", "Prompts answered so far."),
    "fleetdeck_run_failed": ("gauge", "Prompts failed so far."),
    "fleetdeck_run_truncated": ("gauge", "Answers cut at max_tokens so far."),
    "fleetdeck_run_truncated_loops": ("gauge", "Of the answers cut, those that ended in a "
                                      "repetition loop."),
    "fleetdeck_run_empty": ("gauge", "Answers empty or reasoning-only so far."),
    "fleetdeck_run_progress_ratio": ("gauge", "Completed over prompts, 0..1."),
    "fleetdeck_run_requests_per_second": ("gauge", "The engine's completion rate."),
    "fleetdeck_run_output_tokens": ("gauge", "Output tokens generated so far."),
    "fleetdeck_run_eta_seconds": ("gauge", "Time to the end at the current rate."),
    "fleetdeck_run_in_flight": ("gauge", "Requests in flight now."),
    "fleetdeck_server_up": ("gauge", "1 while the server is healthy or degraded."),
    "fleetdeck_server_requests_per_second": ("gauge", "The server's completion rate."),
    "fleetdeck_server_tokens_per_second": ("gauge", "The server's output tokens a second."),
    "fleetdeck_server_completed": ("gauge", "Requests the server answered."),
    "fleetdeck_server_in_flight": ("gauge", "Requests in flight on the server."),
    "fleetdeck_server_queued": ("gauge", "Requests waiting in the server's own queue."),
    "fleetdeck_server_token_usage_ratio": ("gauge", "The server's KV pool in use, 0..1."),
    "fleetdeck_server_accept_length": ("gauge", "Speculative decoding's accept length."),
    "fleetdeck_server_restarts": ("gauge", "Times the supervisor restarted the server."),
    "fleetdeck_alert": ("gauge", "An alert now active (labels say which), always 1."),
    "fleetdeck_alerts_active": ("gauge", "Alerts now active."),
    "fleetdeck_pages_pending": ("gauge", "Pages waiting for the webhook."),
    "fleetdeck_pages_dropped": ("gauge", "Pages lost (queue full or refused)."),
    "fleetdeck_pages_posted": ("gauge", "Posts the webhook took."),
    "fleetdeck_textfile_updated_timestamp_seconds": (
        "gauge", "When this file was written: alert on its age (a dead supervisor)."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


def render(snap: Snapshot, now: float | None = None) -> str:
    """The textfile for one snapshot: each metric's HELP and TYPE once, then its samples."""
    now = time.time() if now is None else now
    run = {"run": snap.run}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {k: [] for k in METRICS}

    def put(name: str, value: float | None, labels: dict[str, str] | None = None) -> None:
        if value is not None:
            samples[name].append(({**run, **(labels or {})}, value))

    put("fleetdeck_run_info", 1, {"kind": snap.kind, "status": snap.status,
                                  "run_dir": snap.run_dir})
    put("fleetdeck_run_running", 1 if snap.status in ("running", "draining") else 0)
    p = snap.progress
    if p is not None:
        put("fleetdeck_run_prompts", p.total)
        put("fleetdeck_run_completed", p.completed)
        put("fleetdeck_run_failed", p.failed)
        put("fleetdeck_run_truncated", p.truncated)
        put("fleetdeck_run_truncated_loops", p.truncated_loops)
        put("fleetdeck_run_empty", p.empty)
        put("fleetdeck_run_progress_ratio", p.completed / p.total if p.total else 0.0)
        put("fleetdeck_run_requests_per_second", p.rate_per_sec)
        put("fleetdeck_run_output_tokens", p.total_output_tokens)
        put("fleetdeck_run_eta_seconds", p.eta_hours * 3600 if p.eta_hours is not None else None)
        put("fleetdeck_run_in_flight", p.in_flight)
    for s in snap.servers:
        group = s.gpus or ([s.gpu] if s.gpu is not None else None)
        where = {"server": str(s.number), "gpus": label(group) if group else "",
                 "url": s.url}
        put("fleetdeck_server_up", 1 if s.state in ("healthy", "degraded") else 0, where)
        put("fleetdeck_server_requests_per_second", s.req_per_s, where)
        put("fleetdeck_server_tokens_per_second", s.tok_per_s, where)
        put("fleetdeck_server_completed", s.completed, where)
        put("fleetdeck_server_in_flight", s.in_flight, where)
        put("fleetdeck_server_queued", s.queued_reqs, where)
        put("fleetdeck_server_token_usage_ratio", s.token_usage, where)
        put("fleetdeck_server_accept_length",
            s.accept_length_window or s.accept_length or s.accept_length_cum, where)
        put("fleetdeck_server_restarts", s.restarts, where)
    for a in snap.alerts:
        put("fleetdeck_alert", 1, {"code": a.code, "severity": a.severity,
                                   "server": "" if a.server is None else str(a.server)})
    put("fleetdeck_alerts_active", len(snap.alerts))
    if snap.pager is not None:
        put("fleetdeck_pages_pending", snap.pager.pending)
        put("fleetdeck_pages_dropped", snap.pager.dropped)
        put("fleetdeck_pages_posted", snap.pager.posted)
    put("fleetdeck_textfile_updated_timestamp_seconds", now)
    return "".join(_lines(samples))


def _lines(samples: dict[str, list[tuple[dict[str, str], float]]]) -> Iterable[str]:
    for name, rows in samples.items():
        if not rows:
            continue
        kind, text = METRICS[name]
        yield f"# HELP {name} {text}\n# TYPE {name} {kind}\n"
        for labels, value in rows:
            yield f"{name}{_labels(labels)} {_number(value)}\n"


def write(path: Path, text: str) -> None:
    """Replace `path` whole. Not fsynced: a figure lost to a power loss is rewritten in
    seconds, and a fsync a tick would wear on the disk the run writes its data to."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.chmod(tmp, 0o644)  # node_exporter runs as its own user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Textfile:
    """The supervisor's writer: at most one write every INTERVAL_S, in a thread (a slow disk
    never holds the supervisor's loop), never two at once."""

    def __init__(self, path: Path, interval_s: float = INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self._last = 0.0
        self._writing: asyncio.Future[None] | None = None
        self.last_error: str | None = None

    def offer(self, snap: Snapshot, force: bool = False) -> None:
        now = time.monotonic()
        if self._writing is not None and not self._writing.done():
            return
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        self._writing = asyncio.ensure_future(asyncio.to_thread(self._write, render(snap)))

    def _write(self, text: str) -> None:
        try:
            write(self.path, text)
            self.last_error = None
        except OSError as exc:
            if self.last_error is None:
                log.warning("%s: cannot write the Prometheus textfile: %s", self.path,
                            exc.strerror or exc)
            self.last_error = str(exc)

    async def flush(self, snap: Snapshot) -> None:
        """The last word at exit, written before the supervisor goes."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        await asyncio.to_thread(self._write, render(snap))
