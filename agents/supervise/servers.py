"""The SGLang servers of a run: launched one per GPU group of `[servers] gpus` (one GPU each
for a flat list) from the spec's command template, watched (liveness, health, figures),
restarted with backoff, and adopted by a new supervisor.

Each server runs in a session of its own with its output going straight to a log file, so a
supervisor's death neither kills nor blinds it. servers.json records pid, process start time,
port and GPUs: a new supervisor adopts a server only when all four match and it answers, or
when its log says it is still loading. Stopping a server stops its whole process group (the
launch process, SGLang's scheduler and detokenizer, anything else it started), and a new one
starts only once none of the group is left.
Its files are named by the group's first GPU (launch_gpu0.sh, sglang_gpu0.log for GPUs 0,1):
no two groups share a GPU, and a flat list keeps the names it always had.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from agents.rundir.atomic import atomic_write
from agents.rundir.gpugroups import label, visible_devices
from agents.rundir.secrets import secret_env_names
from agents.rundir.spec import RunSpec
from agents.rundir.template import render
from agents.supervise.crashcause import CrashCause, classify, read_tail
from agents.supervise.procinfo import (
    group_is_ours,
    group_members,
    kill_group,
    same_process,
    start_time,
)
from agents.supervise.retractions import Retractions
from agents.supervise.sglang_log import LAUNCH_MARKER, LogTail
from agents.supervise.sglang_metrics import (
    MetricsReading,
    ServerFigures,
    ServerInfo,
    read_error_body,
    read_metrics,
    read_server_info,
    server_figures,
)

log = logging.getLogger("fleetdeck.servers")
# A server healthy this long has recovered: its restart backoff starts over.
STREAK_RESET_S = 600.0
# After SIGKILL, how long a server's processes may take to be gone (a process tearing down
# GPU memory can sit in the kernel for a while) before the supervisor says so and goes on.
KILL_WAIT_S = 60.0


async def fetch_server_info(client: httpx.AsyncClient, url: str, paths: list[str],
                            api_key: str | None) -> tuple[ServerInfo | None, str | None]:
    """The server-info body from the path that answered last (`paths`, kept between calls:
    /server_info, /get_server_info); on a 404 the other path is tried and, if it answers,
    kept first. A key is sent when the run has one (the endpoint needs it; /health and
    /metrics do not). Returns the body read, or None and what the server answered."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    answers = []
    for path in list(paths):
        resp = await client.get(f"{url}{path}", timeout=5.0, headers=headers)
        if resp.status_code == 200:
            if path != paths[0]:
                paths.remove(path)
                paths.insert(0, path)
            try:
                return read_server_info(resp.json()), None
            except ValueError:
                answers.append(f"{path} answered 200 with a body that is not JSON")
                break
        answers.append(f"{path} answered {resp.status_code}: "
                       f"{read_error_body(resp.text).message}")
        if resp.status_code != 404:
            break
    return None, f"figures from {url}: " + "; ".join(answers)


async def fetch_figures(client: httpx.AsyncClient, url: str, info_paths: list[str],
                        api_key: str | None
                        ) -> tuple[ServerInfo | None, MetricsReading | None, str | None]:
    """One read of a server's own figures: its server info (fetch_server_info, with what it
    answered when that failed) and /metrics (None without --enable-metrics: a 404).
    httpx.HTTPError when the server does not answer at all."""
    info, error = await fetch_server_info(client, url, info_paths, api_key)
    met = await client.get(f"{url}/metrics", timeout=5.0)
    return info, read_metrics(met.text) if met.status_code == 200 else None, error


def unanswered(url: str, exc: Exception) -> str:
    return f"figures from {url}: {type(exc).__name__}: {exc}"


class ServerRecord(msgspec.Struct):
    number: int
    gpu: int  # the group's first GPU
    port: int
    pid: int | None
    start_ticks: int | None
    started_at: float | None
    restarts: int = 0
    # Every GPU of the server; missing from a record written before groups (then [gpu]).
    gpus: list[int] | None = None

    @property
    def group(self) -> list[int]:
        return self.gpus if self.gpus is not None else [self.gpu]


@dataclass(slots=True)
class ManagedServer:
    number: int
    gpus: list[int]  # in the server's device order; the first is `gpu`
    port: int
    pid: int | None = None
    start_ticks: int | None = None
    started_at: float | None = None
    state: str = "starting"
    restarts: int = 0
    fails_in_row: int = 0
    down_since: float | None = None
    next_restart_at: float | None = None
    last_error: str | None = None
    health_checked_at: float | None = None
    metrics_at: float | None = None
    adopted: bool = False
    # Automatic restarts since the server was last healthy for a while: drives the backoff
    # and the limit (the lifetime `restarts` only counts, for people).
    streak: int = 0
    healthy_since: float | None = None
    proc: subprocess.Popen[bytes] | None = None
    # What its log said when it last exited (crashcause), and the cause of a death at
    # start-up, kept while the next start is tried: the same deterministic cause twice in a
    # row stops the restarts, with `restarts_stopped` saying why.
    cause: CrashCause | None = None
    startup_cause: CrashCause | None = None
    restarts_stopped: str | None = None
    figures: ServerFigures = field(default_factory=ServerFigures)
    retractions: Retractions = field(default_factory=lambda: Retractions(300.0))

    @property
    def gpu(self) -> int:
        return self.gpus[0]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def record(self) -> ServerRecord:
        return ServerRecord(self.number, self.gpu, self.port, self.pid, self.start_ticks,
                            self.started_at, self.restarts, gpus=list(self.gpus))

    def process_alive(self) -> bool:
        if self.pid is None:
            return False
        if self.proc is not None:
            return self.proc.poll() is None  # reaps our own child
        return self.start_ticks is not None and same_process(self.pid, self.start_ticks)


class ServerSet:
    def __init__(self, spec: RunSpec, run_dir: Path,
                 on_state: Callable[[ManagedServer], None] | None = None,
                 on_figures: Callable[[ManagedServer], None] | None = None) -> None:
        self.spec = spec
        self.cfg = spec.servers
        self.run_dir = run_dir
        self.on_state = on_state
        self.on_figures = on_figures
        self.servers = [ManagedServer(number=i, gpus=g, port=self.cfg.base_port + i,
                                      retractions=Retractions(spec.alerts.window_s))
                        for i, g in enumerate(self.cfg.groups)]
        self.closed = False
        # Set by stop_all: a server's exit is then the stop's doing, never "down" or a restart.
        self.stopping = False
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.cfg.health_timeout_s,
                                                               connect=5.0))
        self._tasks: list[asyncio.Task[None]] = []
        # While adopt_or_launch runs: the records of the servers it has not reached yet, which
        # every save keeps as they were (see save).
        self._unreached: dict[int, ServerRecord] = {}

    # -- records ----------------------------------------------------------------------------

    @property
    def record_path(self) -> Path:
        return self.run_dir / "servers.json"

    def save(self) -> None:
        """Write servers.json (durably: a resume adopts from it). A server that
        adopt_or_launch has not reached yet keeps its record as it was: the launch of an
        earlier one must not write it as never started, its restarts at 0 and its pid gone
        (a crash then would forget the restarts, and orphan a server that still runs)."""
        records = [self._unreached.get(s.number) or s.record() for s in self.servers]
        atomic_write(self.record_path, msgspec.json.encode(records))

    def load_records(self) -> dict[int, ServerRecord]:
        try:
            recs = msgspec.json.decode(self.record_path.read_bytes(), type=list[ServerRecord])
        except (FileNotFoundError, msgspec.DecodeError):
            return {}
        return {r.number: r for r in recs}

    # -- launch and adoption ----------------------------------------------------------------

    def command_for(self, server: ManagedServer) -> str:
        """The command line for one server, every substituted value shell-quoted (the
        template itself was checked at spec load: known placeholders, none inside quotes)."""
        return render(self.cfg.command or "", self.cfg.model or "", server.port, server.gpus)

    def launch(self, server: ManagedServer) -> None:
        """Start the server: a launch script with the exact command and environment, output
        appended to logs/sglang_gpu{G}.log (G: its first GPU), its own session (process
        group)."""
        (self.run_dir / "launch").mkdir(exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        env = {"CUDA_VISIBLE_DEVICES": visible_devices(server.gpus), **self.cfg.env}
        hidden = set(secret_env_names(env, self.cfg.secret_env))
        script = self.run_dir / "launch" / f"launch_gpu{server.gpu}.sh"
        lines = ["#!/bin/sh", f"# fleetdeck: server {server.number} on GPU "
                 f"{visible_devices(server.gpus)} ({len(server.gpus)} GPU"
                 f"{'s' if len(server.gpus) != 1 else ''}), port {server.port}",
                 f"cd {shlex.quote(str(self.run_dir))}"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())
                  if k not in hidden]
        if hidden:
            # Secrets reach the server in its environment only, never in a file of the run.
            lines.append(f"# secret, set in the environment by the supervisor: "
                         f"{' '.join(sorted(hidden))}")
        lines.append(f"exec {self.command_for(server)}")
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o755)
        with open(self.log_path(server), "ab") as out:
            out.write(f"\n{LAUNCH_MARKER} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                      .encode())
            out.flush()
            proc = subprocess.Popen(["/bin/sh", str(script)], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.run_dir,
                                    env={**os.environ, **env})
        server.proc = proc
        server.pid = proc.pid
        server.start_ticks = start_time(proc.pid)
        server.started_at = time.time()
        server.adopted = False
        server.fails_in_row = 0
        server.figures = ServerFigures()
        self._set_state(server, "starting")
        self.save()
        log.info("server %d launched on GPU %s, port %d, pid %d", server.number,
                 label(server.gpus), server.port, proc.pid)

    async def _answers(self, server: ManagedServer) -> bool:
        try:
            resp = await self._client.get(f"{server.url}/health")
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def adopt_or_launch(self) -> None:
        self._unreached = self.load_records()
        try:
            await self._adopt_or_launch()
        finally:
            self._unreached = {}
        self.save()

    async def _adopt_or_launch(self) -> None:
        for server in self.servers:
            rec = self._unreached.pop(server.number, None)
            if rec is not None:
                server.restarts = rec.restarts
            if (rec is not None and rec.pid and rec.start_ticks
                    and same_process(rec.pid, rec.start_ticks)):
                server.pid, server.start_ticks = rec.pid, rec.start_ticks
                server.started_at = rec.started_at
                moved = [f"{what} {was} (now {now})" for what, was, now in (
                    ("port", rec.port, server.port),
                    ("GPU", label(rec.group), label(server.gpus))) if was != now]
                if not moved and await self._answers(server):
                    server.adopted = True
                    self._set_state(server, "healthy")
                    log.info("server %d adopted (pid %d, GPU %s)", server.number, rec.pid,
                             label(server.gpus))
                    continue
                if not moved and self._still_loading(server):
                    # A real server loads for minutes: killing it would only start that over.
                    # Its start-up timeout still runs from its own launch.
                    server.adopted = True
                    self._set_state(server, "starting")
                    log.info("server %d adopted while it loads (pid %d, GPU %s, launched "
                             "%.0f s ago)", server.number, rec.pid, label(server.gpus),
                             time.time() - (server.started_at or time.time()))
                    continue
                # Ours (pid and start ticks match) but not what the spec asks for now: it
                # still holds its GPUs, so it goes before the new one starts on them.
                log.warning("server %d (pid %d) %s: replacing it", server.number, rec.pid,
                            f"runs on {', '.join(moved)}" if moved
                            else "is alive but does not answer")
                await self._terminate(server)
            elif rec is not None and rec.pid:
                log.info("server %d: recorded pid %d is gone or is another process now: "
                         "launching a new one", server.number, rec.pid)
            self.launch(server)

    def log_path(self, server: ManagedServer) -> Path:
        return self.run_dir / "logs" / f"sglang_gpu{server.gpu}.log"

    def _still_loading(self, server: ManagedServer) -> bool:
        """A live server of ours that does not answer yet is loading, not hung, when its log
        has not said ready since its launch and its start-up timeout has not run out."""
        if server.started_at is None or \
                time.time() - server.started_at > self.cfg.startup_timeout_s:
            return False
        reader = LogTail(self.log_path(server)).poll()
        # No launch marker in the log's last MiB: it has written more than that since, which
        # a loading server does not.
        return reader.launches > 0 and not reader.startup.ready

    # -- watching ---------------------------------------------------------------------------

    def _set_state(self, server: ManagedServer, state: str) -> None:
        if server.state != state:
            log.info("server %d: %s -> %s", server.number, server.state, state)
            server.state = state
            if state in ("down", "restarting") and server.down_since is None:
                server.down_since = time.time()
            if state == "healthy":
                server.down_since = None
                server.healthy_since = time.time()
            else:
                server.healthy_since = None
            if self.on_state is not None:
                self.on_state(server)

    def start(self) -> None:
        for server in self.servers:
            self._tasks.append(asyncio.create_task(self._watch(server)))
            self._tasks.append(asyncio.create_task(self._figures(server)))

    async def wait_healthy(self, timeout: float, stop: Callable[[], bool] | None = None) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (stop is not None and stop()):
            if all(s.state == "healthy" for s in self.servers):
                return True
            await asyncio.sleep(0.1)
        return False

    async def _watch(self, server: ManagedServer) -> None:
        cfg = self.cfg
        while not self.closed:
            now = time.time()
            if server.state == "stopped" or self.stopping:
                pass
            elif not server.process_alive():
                await self._on_dead(server, now)
            else:
                ok = await self._answers(server)
                server.health_checked_at = time.time()
                if ok:
                    server.fails_in_row = 0
                    # It started: a new cause starts a new count, and the old one is history.
                    server.startup_cause = server.cause = None
                    self._set_state(server, "healthy")
                    if server.streak and server.healthy_since is not None and \
                            now - server.healthy_since > STREAK_RESET_S:
                        server.streak = 0
                elif server.state == "starting":
                    if server.started_at and now - server.started_at > cfg.startup_timeout_s:
                        server.last_error = f"not ready after {cfg.startup_timeout_s:.0f} s"
                        await self.restart(server, server.last_error)
                else:
                    server.fails_in_row += 1
                    server.last_error = "health check failed or timed out"
                    if server.fails_in_row >= cfg.health_failures_to_down:
                        self._set_state(server, "down")
                    elif server.state == "healthy":
                        self._set_state(server, "degraded")
                    if (server.state == "down" and server.down_since is not None
                            and now - server.down_since > cfg.hung_restart_s):
                        await self.restart(server, "hung: no health answer for "
                                           f"{now - server.down_since:.0f} s", hung=True)
            await asyncio.sleep(cfg.health_interval_s)

    async def _on_dead(self, server: ManagedServer, now: float) -> None:
        cfg = self.cfg
        if server.restarts_stopped is not None:
            return
        if server.next_restart_at is None:
            at_startup = server.state == "starting"
            code = server.proc.returncode if server.proc is not None else None
            pid = server.pid
            cause = classify(await asyncio.to_thread(read_tail, self.log_path(server)))
            if self.stopping or server.state == "stopped" or server.pid != pid:
                return  # stopped, or relaunched (restart-server), while the log was read
            server.cause = cause
            server.last_error = f"process {server.pid} exited" + (
                f" with {code}" if code is not None else "") + (
                " at start-up" if at_startup else "") + (
                f": {cause.text()}" if cause is not None else "")
            log.warning("server %d: %s", server.number, server.last_error)
            self._set_state(server, "down")
            if at_startup and cause is not None and cause.deterministic and \
                    cause == server.startup_cause:
                # It will say the same on every start: restarting only burns the backoff.
                server.restarts_stopped = (f"the same {cause.label} at start-up twice in a "
                                           f"row ({cause.line}): {cause.advice}")
                server.last_error = f"restarts stopped: {server.restarts_stopped}"
                log.error("server %d: %s", server.number, server.last_error)
                return
            server.startup_cause = cause if at_startup else None
            server.next_restart_at = now + cfg.restart_backoff_s * 2 ** min(server.streak, 6)
        if server.streak >= cfg.max_restarts:
            server.last_error = f"gave up after {server.streak} restarts in a row" + (
                f"; the last exit: {server.cause.text()}" if server.cause is not None else "")
            return
        if server.next_restart_at is not None and now >= server.next_restart_at:
            await self.restart(server, server.last_error or "process exited")

    async def restart(self, server: ManagedServer, reason: str, manual: bool = False,
                      hung: bool = False) -> None:
        log.warning("server %d: restarting (%s)", server.number, reason)
        if manual:
            # Someone fixed what stopped it (the model put in place), or wants to see again.
            server.restarts_stopped = None
            server.startup_cause = None
        self._set_state(server, "restarting")
        await self._terminate(server, hung=hung)
        server.restarts += 1
        if not manual:
            server.streak += 1
        server.next_restart_at = None
        self.launch(server)

    async def _terminate(self, server: ManagedServer, grace_s: float = 10.0,
                         hung: bool = False) -> None:
        """Stop the server's whole process group and return once none of it runs.

        A live server gets SIGTERM (SGLang drains, then exits), with SIGCONT so that a stopped
        process acts on it, and SIGKILL after grace_s. A hung one gets SIGKILL at once: it
        drains nothing, and a stopped process would sit on a SIGTERM for the whole grace.
        When the launch process died alone, what it left gets the grace to go by itself
        (SGLang's scheduler and detokenizer die with it; its resource tracker cleans up for
        a few seconds and ignores SIGTERM), then SIGKILL: a scheduler left behind would hold
        the GPUs, and a new server on them starts only when the group is gone."""
        pid = server.pid
        if pid is None or not group_is_ours(pid, server.start_ticks):
            return  # the pid names another process now: its group is long gone
        left = await self._group_left(server)
        if left and not hung:
            alive = server.process_alive()
            if alive:
                kill_group(pid, signal.SIGTERM)
                kill_group(pid, signal.SIGCONT)
            left = await self._group_wait(server, grace_s)
            if left:
                log.warning("server %d: %s still there %.0f s after %s: SIGKILL",
                            server.number, _processes(left), grace_s,
                            "SIGTERM" if alive else "its launch process died")
        elif left:
            log.warning("server %d is hung: SIGKILL to its process group (%s)",
                        server.number, _processes(left))
        if left:
            kill_group(pid, signal.SIGKILL)
            left = await self._group_wait(server, KILL_WAIT_S)
            if left:
                log.error("server %d: %s still there %.0f s after SIGKILL; launching anyway",
                          server.number, _processes(left), KILL_WAIT_S)

    async def _group_left(self, server: ManagedServer) -> list[int]:
        """The server's processes that still run (our own child reaped first: a zombie is
        gone)."""
        if server.proc is not None:
            server.proc.poll()
        assert server.pid is not None
        return await asyncio.to_thread(group_members, server.pid)

    async def _group_wait(self, server: ManagedServer, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while (left := await self._group_left(server)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return left

    async def _figures(self, server: ManagedServer) -> None:
        """Every few seconds: /server_info (/get_server_info on a 404: SGLang up to 0.5.5),
        /metrics, and the log's newest decode line of each DP rank, made into one set of
        figures (sglang_metrics.server_figures); what no source carries stays None."""
        tail = LogTail(self.log_path(server))
        info_paths = ["/server_info", "/get_server_info"]
        while not self.closed:
            await asyncio.sleep(max(self.cfg.health_interval_s, 1.0))
            if server.state not in ("healthy", "degraded"):
                continue
            info: ServerInfo | None = None
            metrics: MetricsReading | None = None
            try:
                info, metrics, error = await fetch_figures(self._client, server.url,
                                                           info_paths, self.cfg.api_key)
            except httpx.HTTPError as exc:
                error = unanswered(server.url, exc)
            if error is not None:
                self._figures_failed(server, error)
            reader = await asyncio.to_thread(tail.poll)
            server.figures = server_figures(info, metrics, reader.combined(), reader.startup,
                                            reader.retracted)
            server.metrics_at = time.time()
            server.retractions.add(server.metrics_at, server.figures)
            if self.on_figures is not None:
                self.on_figures(server)

    def _figures_failed(self, server: ManagedServer, error: str) -> None:
        """A figures read that failed is the server's last error only while it still serves:
        a read cut short by the server's death ("Server disconnected") said nothing of it and
        hid what did ("process N exited"), and a server down says why itself."""
        if server.state in ("healthy", "degraded") and server.process_alive():
            server.last_error = error

    async def stop_all(self) -> None:
        # Before the first SIGTERM: a watcher that saw a stopped server's exit would call it
        # down (seen under load: starting -> down -> stopped), or relaunch it mid-stop.
        self.stopping = True
        for server in self.servers:
            await self._terminate(server)
            self._set_state(server, "stopped")
        self.save()

    async def stop_left(self) -> list[int]:
        """Stop, from servers.json, the servers a dead supervisor left running (`up --wait`
        gives the machine back: a server must not outlive its task). The numbers of those
        that still ran."""
        records = self.load_records()
        left = []
        for server in self.servers:
            rec = records.get(server.number)
            if rec is None or not rec.pid:
                continue
            server.pid, server.start_ticks = rec.pid, rec.start_ticks
            server.started_at, server.restarts = rec.started_at, rec.restarts
            if group_is_ours(rec.pid, rec.start_ticks) and await self._group_left(server):
                left.append(server.number)
        await self.stop_all()
        return left

    async def close(self) -> None:
        self.closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    def status_fields(self, server: ManagedServer) -> dict[str, Any]:
        return {
            "gpu": server.gpu, "gpus": list(server.gpus), "port": server.port, "pid": server.pid,
            "restarts": server.restarts, "started_at": server.started_at,
            "exit_cause": server.cause.kind if server.cause is not None else None,
            "restarts_stopped": server.restarts_stopped,
            **figure_fields(server.figures, server.retractions),
            "health_checked_at": server.health_checked_at, "metrics_at": server.metrics_at,
        }


def _processes(pids: list[int]) -> str:
    return f"process{'es' if len(pids) != 1 else ''} {' '.join(map(str, pids))}"


def figure_fields(f: ServerFigures, retractions: Retractions | None = None) -> dict[str, Any]:
    """SGLang's own figures as fields of a snapshot's server row (ServerStatus), with the
    retractions seen over the alert window when they are counted."""
    return {
        "kv_capacity_tokens": f.kv_capacity_tokens, "kv_used_tokens": f.kv_used_tokens,
        "retracted_total": f.retracted_total,
        "retracted_recent": retractions.recent() if retractions is not None else None,
        "running_reqs": f.running_reqs, "queued_reqs": f.queued_reqs,
        "gen_throughput": f.gen_throughput, "token_usage": f.token_usage,
        "effective_max_running": f.effective_max_running,
        "accept_length_cum": f.accept_length_cum,
        "accept_length_window": f.accept_length_window,
        "accept_length_log": f.accept_length_log,
    }
