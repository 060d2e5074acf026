"""The run supervisor: one detached process per run. It launches (or adopts) the servers,
runs the job (the engine in-process, or the trainer as a subprocess), watches everything,
raises alerts, and answers RPC on a Unix socket. `python -m agents.supervise.supervisor RUN_DIR`."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents import __version__
from agents.engine import EngineError
from agents.engine.run import Engine
from agents.engine.serverload import ServerLoad
from agents.engine.store import StoreError
from agents.engine.uploader import S3Unavailable
from agents.rpc.campaign import (
    launch_check,
    launch_overrides,
)
from agents.rpc.methods import ControlMethods, check_hello
from agents.rpc.protocol import (
    NOT_RUNNING,
    REFUSED,
    STREAM_LIMIT,
    RpcError,
    dispatch_line,
    notification,
)
from agents.rpc.sockpath import SocketDirError, remove_stale_sockets, socket_path
from agents.rpc.train_launch import launched_otherwise
from agents.rundir.control import audit
from agents.rundir.histstore import MAX_LIMIT, read_history
from agents.rundir.schema import ServerStatus, Snapshot, encoder
from agents.rundir.spec import RunSpec, SpecError, load_run_spec
from agents.supervise.acceptdrift import AcceptLevels, accept_levels
from agents.supervise.alerts import AlertBook
from agents.supervise.pager import Pager
from agents.supervise.procinfo import exit_status
from agents.supervise.provenance import capture_live
from agents.supervise.retractions import Retractions
from agents.supervise.router import RouterWatch
from agents.supervise.servers import ManagedServer, ServerSet
from agents.supervise.sglang_metrics import ServerFigures
from agents.supervise.snapshot import (
    DiskWatch,
    Nvml,
    read_progress,
    read_train_progress,
    server_row,
)
from agents.supervise.textfile import Textfile
from agents.supervise.train_job import ask_to_stop
from agents.supervise.urlwatch import UrlServer, UrlWatch

log = logging.getLogger("fleetdeck.supervisor")
# A provenance capture that failed (no /server_info yet) is tried again after 2, 4, 8 ... s.
PROVENANCE_BACKOFF_S = 2.0
PROVENANCE_BACKOFF_MAX_S = 120.0
PUSH_INTERVAL_S = float(os.environ.get("FLEETDECK_PUSH_INTERVAL_S", "1.0"))
PAGER_DRAIN_S = 10.0  # at exit, how long pages still queued may take to go
# How often the history's compacted copy and the accept levels are brought up to date.
HISTORY_REFRESH_S = float(os.environ.get("FLEETDECK_HISTORY_REFRESH_S", "30.0"))


class Supervisor:
    def __init__(self, run_dir: Path, down_after_job: bool = False) -> None:
        self.run_dir = run_dir.resolve()
        # `up --wait`: the job's end, however it ends, brings the servers and this process
        # down (a scheduler gives the machine back when its task exits).
        self.down_after_job = down_after_job
        self.going_down = False
        try:
            self.spec: RunSpec = load_run_spec(self.run_dir)
        except SpecError as exc:
            raise SystemExit(f"supervisor for {self.run_dir}: {exc}") from None
        self.servers: ServerSet | None = None
        # [servers] router = true: the router's workers, watched (rows 1.. after the router's).
        self.router: RouterWatch | None = None
        # [servers] urls without a router: servers started elsewhere, their figures watched.
        self.urlwatch: UrlWatch | None = None
        self.engine: Engine | None = None
        self.engine_task: asyncio.Task[int] | None = None
        self.job_refused = False  # the last start_job was refused (status says failed)
        # A new engine is being prepared: status says starting, not the last engine's word
        # (a done node restarted by an adopt or a resume read as idle for up to a second).
        self.preparing_job = False
        self._prepared = asyncio.Event()  # clear while an engine is being prepared
        self._prepared.set()
        self.train_proc: subprocess.Popen[bytes] | None = None
        self.alerts = AlertBook(self.spec.alerts)
        # Pages and metrics from the node itself: neither waits for a console.
        cfg = self.spec.alerts
        self.pager = Pager(cfg.webhook, cfg.webhook_format,
                           f"{socket.gethostname()}/{self.spec.run.name}",
                           per_minute=cfg.webhook_per_minute, queue_max=cfg.webhook_queue) \
            if cfg.webhook else None
        self.textfile = Textfile(Path(cfg.prometheus_textfile).expanduser()) \
            if cfg.prometheus_textfile else None
        self.disk = DiskWatch(self.run_dir)
        self.nvml = Nvml()
        self.subscribers: set[asyncio.StreamWriter] = set()
        self.exit = asyncio.Event()
        self.status = "starting"
        self.message: str | None = None
        self.stop_servers_after_job = False
        self.starting = True  # until the servers are up and the job has been started
        self.control = ControlMethods(self.run_dir)
        self._background: set[asyncio.Task[Any]] = set()
        # provenance.json: captured once per supervisor, tried again (backing off) until then
        self._provenance_taken = False
        self._provenance_busy = False
        self._provenance_tries = 0
        self._provenance_next = 0.0  # time.monotonic() of the next try

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- life -------------------------------------------------------------------------------

    def _lock(self) -> None:
        self._lock_fd = os.open(self.run_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"{self.run_dir}: another supervisor runs this run") from None
        (self.run_dir / "supervisor.pid").write_text(f"{os.getpid()}\n")

    async def main(self) -> int:
        try:
            sock = socket_path(self.run_dir)
        except SocketDirError as exc:
            raise SystemExit(f"supervisor for {self.run_dir}: {exc}") from None
        self._lock()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: self._spawn(self.down("signal")))
        if sock.exists():
            sock.unlink()
        for stale in remove_stale_sockets(sock.parent, keep=sock):
            log.info("removed %s: a socket of a supervisor that is gone", stale)
        # Bound under another name and renamed once it listens: a socket that is bound but not
        # yet listening refuses connections, and another supervisor's sweep (runs launched at
        # once: a campaign) would take it for a stale one and remove it under us.
        bound = sock.with_suffix(".new")
        if bound.exists():
            bound.unlink()
        server = await asyncio.start_unix_server(self._session, path=str(bound),
                                                 limit=STREAM_LIMIT)
        os.chmod(bound, 0o600)
        os.replace(bound, sock)
        (self.run_dir / "agent.sock.path").write_text(f"{sock}\n")
        log.info("supervisor %d for %s listening on %s", os.getpid(), self.run_dir, sock)
        pusher = asyncio.create_task(self._push_loop())
        paging = asyncio.create_task(self.pager.run()) if self.pager is not None else None
        history = asyncio.create_task(self._history_loop()) \
            if self.spec.run.kind == "generate" else None
        try:
            await self._start_servers()
            # A `down` during start-up wins; a `resume` during it may have started the job.
            if not self.exit.is_set() and not self.job_running():
                await self._start_if_idle()
            self.starting = False
            await self.exit.wait()
            # The last word, after the job and the servers ended, before the socket closes:
            # `up --wait` reads from it how the job ended.
            pusher.cancel()
            if self.subscribers:
                await self._push()
            if self.pager is not None:
                await self.pager.drain(PAGER_DRAIN_S)  # pages queued before the down still go
            if self.textfile is not None:
                await self.textfile.flush(self.snapshot())  # the run's last word for Grafana
        finally:
            pusher.cancel()
            if paging is not None:
                paging.cancel()
            if history is not None:
                history.cancel()
            server.close()
            for w in list(self.subscribers):
                w.close()
            if self.servers is not None:
                await self.servers.close()
            if self.router is not None:
                await self.router.close()
            if self.urlwatch is not None:
                await self.urlwatch.close()
            try:
                sock.unlink()
            except FileNotFoundError:
                pass
            (self.run_dir / "supervisor.pid").unlink(missing_ok=True)
        log.info("supervisor exits")
        return 0

    async def _start_servers(self) -> None:
        if self.spec.servers.router:
            self.router = RouterWatch(self.spec)
            self.router.start()
        elif self.spec.servers.urls and not self.spec.servers.gpus:
            self.urlwatch = UrlWatch(self.spec, on_figures=self._url_figures)
            self.urlwatch.start()
        if not self.spec.servers.gpus:
            return
        self.servers = ServerSet(self.spec, self.run_dir, on_state=self._server_state,
                                 on_figures=self._server_figures)
        await self.servers.adopt_or_launch()
        self.servers.start()
        timeout = self.spec.servers.startup_timeout_s
        if not await self.servers.wait_healthy(timeout, stop=self.exit.is_set):
            self.message = f"not every server was healthy within {timeout:.0f} s"
            log.warning(self.message)

    def _server_state(self, server: ManagedServer) -> None:
        if server.state == "healthy":
            # The first ready server says how the lines are made (provenance.json): the node
            # may be gone by the time anyone exports.
            self._try_provenance(server.url,
                                 self.run_dir / "launch" / f"launch_gpu{server.gpu}.sh")
        if self.engine is not None and self.engine_task is not None:
            self.engine.set_server_state(server.number,
                                         server.state in ("healthy", "degraded"))

    def _try_provenance(self, url: str, script: Path | None) -> None:
        """A capture from this server, unless one was recorded, one is under way, or the
        last failed too recently (each server tick asks again, backing off)."""
        if self._provenance_taken or self._provenance_busy or \
                time.monotonic() < self._provenance_next:
            return
        self._provenance_busy = True
        self._spawn(self._provenance(url, script))

    async def _provenance(self, url: str, script: Path | None) -> None:
        try:
            await capture_live(self.spec, self.run_dir, url, script)
            self._provenance_taken = True
        except Exception as exc:  # never the supervisor's end: said, and the run goes on
            self._provenance_tries += 1
            wait = min(PROVENANCE_BACKOFF_MAX_S,
                       PROVENANCE_BACKOFF_S * 2 ** (self._provenance_tries - 1))
            self._provenance_next = time.monotonic() + wait
            log.warning("provenance not recorded: %s: %s; trying again in %.0f s",
                        type(exc).__name__, exc, wait)
        finally:
            self._provenance_busy = False

    def _server_figures(self, server: ManagedServer) -> None:
        if server.state == "healthy":
            self._try_provenance(server.url,
                                 self.run_dir / "launch" / f"launch_gpu{server.gpu}.sh")
        self._to_engine(server.number, server.figures, server.retractions)

    def _url_figures(self, server: UrlServer) -> None:
        if server.info_answered:
            # A server started elsewhere says how it was set up too (no launch script here).
            self._try_provenance(server.url, None)
        self._to_engine(server.number, server.figures, server.retractions)

    def _to_engine(self, number: int, f: ServerFigures, retractions: Retractions) -> None:
        """SGLang's own figures reach the engine: its deadlines (the pace before a server
        has answered, its queue and retractions) and its auto-tuner (a level that only
        queues or retracts)."""
        if self.engine is not None:
            self.engine.server_figures(number, ServerLoad(
                running=f.running_reqs, queued=f.queued_reqs, gen_throughput=f.gen_throughput,
                token_usage=f.token_usage, retracted=retractions.seen))

    async def start_job(self) -> None:
        if self.job_running():
            raise RpcError(REFUSED, "the job is already running")
        if self.preparing_job:
            raise RpcError(REFUSED, "the job is already starting")
        if self.spec.run.kind == "train":
            self._start_trainer()
            return
        urls = [s.url for s in self.servers.servers] if self.servers else None
        engine = Engine(self.spec, urls=urls)
        self.preparing_job = True
        self._prepared.clear()
        try:
            await asyncio.to_thread(engine.prepare)
        except (EngineError, S3Unavailable, StoreError, ValueError, OSError) as exc:
            self.status = "failed"
            self.message = f"the engine refused to start: {exc}"
            self.job_refused = True
            log.error(self.message)
            if self.down_after_job:
                self._spawn(self.down("the job did not start"))  # status says why
            return
        finally:
            self.preparing_job = False
            self._prepared.set()
        self.job_refused = False
        self.engine = engine
        if self.servers is not None:
            for s in self.servers.servers:
                engine.set_server_state(s.number, s.state in ("healthy", "degraded"))
        self.engine_task = asyncio.create_task(engine.run(install_signals=False))
        self.engine_task.add_done_callback(self._job_ended)

    async def _start_if_idle(self) -> None:
        """start_job, unless a job runs or is being prepared already."""
        if not self.job_running() and not self.preparing_job:
            await self.start_job()

    def _start_trainer(self) -> None:
        """The training job: prepare (the quality gate can stop it here), then train; a
        resumed job continues from its last checkpoint."""
        logfile = self.run_dir / "logs" / "train.log"
        logfile.parent.mkdir(exist_ok=True)
        spec = shlex.quote(str(self.run_dir / "run.toml"))
        py = shlex.quote(sys.executable)
        train = f"exec {py} -m trainer.cli train {spec}"
        if (self.run_dir / "progress.json").exists() and read_train_progress(self.run_dir):
            train += " --resume"
        prepared = Path(self.spec.train.prepared) if self.spec.train else Path("prepared")
        report = (prepared if prepared.is_absolute() else self.run_dir / prepared) / \
            "prepare_report.json"
        script = train if report.exists() else f"{py} -m trainer.cli prepare {spec} && {train}"
        with open(logfile, "ab") as out:
            self.train_proc = subprocess.Popen(
                ["/bin/sh", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.run_dir, start_new_session=True)
        self.status = "running"
        if self.down_after_job:
            self._spawn(self._trainer_ended(self.train_proc))

    async def _trainer_ended(self, proc: subprocess.Popen[bytes]) -> None:
        await exit_status(proc)
        if proc is self.train_proc:
            await self.down("the job ended")

    def _job_ended(self, task: asyncio.Task[int]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.status = "failed"
            self.message = f"the engine crashed: {type(exc).__name__}: {exc}"
            log.error(self.message)
        if self.down_after_job:
            self._spawn(self.down("the job ended"))
        elif self.stop_servers_after_job and self.servers is not None:
            self._spawn(self.servers.stop_all())

    def job_running(self) -> bool:
        if self.engine_task is not None and not self.engine_task.done():
            return True
        return self.train_proc is not None and self.train_proc.poll() is None

    async def stop_job(self, servers: bool) -> None:
        self.stop_servers_after_job = servers
        if self.engine is not None and self.job_running():
            self.engine.request_stop()
        elif self.train_proc is not None and self.train_proc.poll() is None:
            ask_to_stop(self.train_proc.pid)
        elif servers and self.servers is not None:
            await self.servers.stop_all()

    async def down(self, why: str) -> None:
        if self.going_down:
            return  # one down at a time: a second (a signal, an RPC, the job's end) joins it
        self.going_down = True
        log.info("down (%s): stopping the job and the servers", why)
        await self.stop_job(servers=True)
        if self.engine_task is not None:
            await asyncio.gather(self.engine_task, return_exceptions=True)
        if self.train_proc is not None:
            await asyncio.to_thread(self.train_proc.wait)
        if self.servers is not None:
            await self.servers.stop_all()
        self.exit.set()

    # -- status -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        now = time.time()
        if self.router is not None and self.engine is not None and self.router.workers:
            # The engine sees one server, the router; the GPUs held (and paid for) are its
            # workers'.
            self.engine.meter.gpus = len(self.router.workers)
        progress = self.engine.snapshot() if self.engine is not None else None
        age: float | None = 0.0
        if progress is None and self.spec.run.kind == "generate":
            progress, age = read_progress(self.run_dir)
        train = read_train_progress(self.run_dir) if self.spec.run.kind == "train" else None
        servers: list[ServerStatus] = []
        managed = {s.number: s for s in self.servers.servers} if self.servers else {}
        numbers = sorted(set(managed) | {int(k) for k in (progress.servers if progress else {})})
        for n in numbers:
            sp = progress.servers.get(str(n)) if progress else None
            m = managed.get(n)
            state = m.state if m is not None else (sp.state if sp else "down")
            st = server_row(n, sp, url=m.url if m else None,
                            state=state if state != "stopped" else "down")  # type: ignore[arg-type]
            if m is not None and self.servers is not None:
                for key, value in self.servers.status_fields(m).items():
                    setattr(st, key, value)
                st.last_error = m.last_error or st.last_error
                st.gpu_stats = self.nvml.stats(m.gpus)
            elif self.urlwatch is not None:
                self.urlwatch.overlay(st)
            servers.append(st)
        if self.router is not None:
            if servers and self.router.last_error:
                servers[0].last_error = self.router.last_error
            servers += self.router.rows()
        disk = self.disk.status(now)
        alerts = self.alerts.evaluate(progress, servers, disk, now)
        if self.pager is not None and not self.going_down:
            # Servers stopped on purpose (stop --servers, down) are no page.
            stopped = {f"server_down:{n}" for n, m in managed.items() if m.state == "stopped"}
            self.pager.observe([a for a in alerts if a.code not in stopped], now)
        status: str
        if train is None and self.train_proc is not None and self.train_proc.poll():
            status = "failed"
            self.message = (f"the training job exited with {self.train_proc.returncode} "
                            "before training (the quality gate or the memory plan?): see "
                            "logs/train.log")
        elif self.job_refused:
            status = "failed"  # not the last engine's word in progress.json: this one refused
        elif self.preparing_job:
            status = "starting"
        elif progress is not None:
            status = progress.status
        elif train is not None:
            status = train.status
            code = self.train_proc.poll() if self.train_proc is not None else None
            if code not in (None, 0) and status in ("running", "starting"):
                # The trainer died without writing its last word.
                status = "failed"
                self.message = f"the trainer exited with {code}: see logs/train.log"
        else:
            status = self.status
        snap = Snapshot(
            kind=self.spec.run.kind, run=self.spec.run.name, run_dir=str(self.run_dir),
            host=socket.gethostname(), status=status, updated_at=now, source="supervisor",
            agent_version=__version__, supervisor_pid=os.getpid(), progress=progress,
            progress_age_s=age, train=train, servers=servers, alerts=alerts, disk=disk,
            message=(self.message or (progress.message if progress else None)
                     or (train.message if train else None)),
            pager=self.pager.snapshot() if self.pager is not None else None,
        )
        if self.textfile is not None:
            self.textfile.offer(snap)
        return snap

    async def _push_loop(self) -> None:
        while True:
            await asyncio.sleep(PUSH_INTERVAL_S)
            if self.subscribers:
                await self._push()
            elif self.pager is not None or self.textfile is not None:
                self.snapshot()  # alerts judged and paged, the textfile fed, with no console

    async def _history_loop(self) -> None:
        """The history store kept compacted, and the accept levels the alerts judge by read
        from it (at start, so a restarted supervisor has them at once)."""
        failed = False
        while True:
            try:
                self.alerts.levels = await asyncio.to_thread(self._accept_levels)
                failed = False
            except OSError as exc:
                if not failed:
                    log.warning("cannot read %s: %s", self.run_dir / "history.jsonl", exc)
                failed = True
            await asyncio.sleep(HISTORY_REFRESH_S)

    def _accept_levels(self) -> AcceptLevels | None:
        window = read_history(self.run_dir, "all", resolution=60, limit=MAX_LIMIT)
        return accept_levels(window.items, time.time(), self.spec.alerts)

    async def _push(self) -> None:
        # One encode of the snapshot, spliced into the notification envelope.
        line = (b'{"jsonrpc":"2.0","method":"status","params":'
                + encoder.encode(self.snapshot()) + b"}\n")
        for w in list(self.subscribers):
            try:
                w.write(line)
                await asyncio.wait_for(w.drain(), 5)
            except (ConnectionError, TimeoutError, OSError):
                self.subscribers.discard(w)

    # -- RPC --------------------------------------------------------------------------------

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        methods = self._methods(writer)
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # a line over STREAM_LIMIT
                    writer.write(notification("error", {"message": "line too long"}))
                    break
                if not line:
                    break
                if not line.strip():
                    continue
                reply = await dispatch_line(line, methods)
                if reply is not None:
                    writer.write(reply)
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.subscribers.discard(writer)
            writer.close()

    def _methods(self, writer: asyncio.StreamWriter) -> dict[str, Any]:
        async def hello(p: dict[str, Any]) -> Any:
            return check_hello(p, self.run_dir, supervised=True)

        async def status(p: dict[str, Any]) -> Any:
            return encoder_obj(self.snapshot())

        async def subscribe(p: dict[str, Any]) -> Any:
            self.subscribers.add(writer)
            return encoder_obj(self.snapshot())

        async def unsubscribe(p: dict[str, Any]) -> Any:
            self.subscribers.discard(writer)
            return {"ok": True}

        async def stop(p: dict[str, Any]) -> Any:
            servers = bool(p.get("servers", False))
            audit(self.run_dir, "stop", {"servers": servers}, p.get("who"))
            if not self.job_running() and not servers:
                raise RpcError(NOT_RUNNING, "no job is running")
            await self.stop_job(servers)
            return {"status": "draining" if self.job_running() else "stopped"}

        async def down(p: dict[str, Any]) -> Any:
            audit(self.run_dir, "down", {}, p.get("who"))
            self._spawn(self.down("rpc"))
            return {"status": "going down"}

        async def resume(p: dict[str, Any]) -> Any:
            audit(self.run_dir, "resume", {}, p.get("who"))
            if self.job_running():
                return {"status": "running", "message": "the job is already running"}
            if self.preparing_job:
                return {"status": "starting", "message": "the job is starting"}
            if self.starting:
                raise RpcError(REFUSED, "the supervisor is still starting its servers; the job "
                               "starts when they are up")
            if self.servers is not None and any(s.state == "stopped"
                                                for s in self.servers.servers):
                self.servers.stopping = False  # watched again from this launch on
                for s in self.servers.servers:
                    if s.state == "stopped":
                        self.servers.launch(s)
            self.message = None
            await self.start_job()
            if not self.job_running():
                raise RpcError(REFUSED, self.message or "the job did not start")
            return {"status": "started"}

        async def launch(p: dict[str, Any]) -> Any:
            if p.get("check"):
                spec_path = p.get("spec") or str(self.run_dir / "run.toml")
                return await asyncio.to_thread(launch_check, str(spec_path), self.run_dir,
                                               launch_overrides(p, self.run_dir))
            otherwise = launched_otherwise(p, self.spec)
            if otherwise is not None:
                raise RpcError(REFUSED, otherwise)
            return await resume(p)

        async def restart_server(p: dict[str, Any]) -> Any:
            n = int(p["server"])
            audit(self.run_dir, "restart_server", {"server": n}, p.get("who"))
            if self.servers is None or not 0 <= n < len(self.servers.servers):
                raise RpcError(REFUSED, f"no managed server {n} in this run")
            await self.servers.restart(self.servers.servers[n], "restart-server on demand",
                                       manual=True)
            return {"server": n, "state": self.servers.servers[n].state}

        async def resume_from_s3(p: dict[str, Any]) -> Any:
            raise RpcError(REFUSED, f"{self.run_dir}: a supervisor runs this run, its disk is "
                           "here: resume-from-s3 is for a lost disk; use resume")

        methods: dict[str, Any] = self.control.methods()
        methods.update(hello=hello, status=status, subscribe=subscribe, unsubscribe=unsubscribe,
                       stop=stop, down=down, resume=resume, launch=launch,
                       resume_from_s3=resume_from_s3,
                       restart_server=restart_server)
        return methods


def encoder_obj(obj: Any) -> Any:
    """A Struct as plain JSON-ready data (for dispatch_line's encoder)."""
    import msgspec

    return msgspec.to_builtins(obj)


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    down_after_job = "--down-after-job" in args
    if down_after_job:
        args.remove("--down-after-job")
    if len(args) != 1:
        print("usage: python -m agents.supervise.supervisor RUN_DIR [--down-after-job]",
              file=sys.stderr)
        return 2
    run_dir = Path(args[0]).resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return asyncio.run(Supervisor(run_dir, down_after_job).main())


if __name__ == "__main__":
    sys.exit(main())
