"""The generation engine: one asyncio loop that streams the prompt set to the servers, writes
completions crash-safely, uploads closed batches, follows control.json and reports progress."""

from __future__ import annotations

import asyncio
import fcntl
import functools
import heapq
import logging
import os
import resource
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from agents.engine import EngineError, recount
from agents.engine import prompts as prompt_io
from agents.engine.accounting import Meter
from agents.engine.autotune import AutoTuner
from agents.engine.client import (
    Completion,
    RequestFailed,
    abort,
    build_request,
    chat,
    make_client,
)
from agents.engine.collector import Collector, settle_heap
from agents.engine.deadlines import DeadlineMiss, Pace, send_within
from agents.engine.dispatch import Dispatcher, Server
from agents.engine.hedge import Hedger, Job
from agents.engine.journal import Journal, failed, requeued, retry_applied
from agents.engine.lastgood import control_problem, last_good_control
from agents.engine.looplag import LoopLag
from agents.engine.loops import answer_tail, is_loop
from agents.engine.offsets import FILE as OFFSETS_FILE
from agents.engine.offsets import OffsetIndex, StaleOffsets
from agents.engine.pin import check_pin, publish_pin
from agents.engine.progress import PROGRESS_INTERVAL_S, Heartbeat, progress_of
from agents.engine.queuefeed import FEED_YIELD, QueueFeed
from agents.engine.retries import find_truncated
from agents.engine.serverload import ServerLoad
from agents.engine.store import BatchStore, ClosedBatch
from agents.engine.uploader import RUN_FOLDER, Uploader, check_bucket, make_s3_client
from agents.queue.worker import QueueWorker
from agents.rundir.atomic import make_dirs
from agents.rundir.control import ControlError, ensure_control, read_control
from agents.rundir.crashpoint import crash_point
from agents.rundir.schema import (
    BatchLine,
    Control,
    Progress,
    Usage,
    encoder,
)
from agents.rundir.spec import GenerateSection, RunSpec, SpecError, keep_copy

log = logging.getLogger("fleetdeck.engine")

# "Later" answers a request may get before they count as its tries: a server whose queue
# stays full for minutes (pauses up to 10 s) is not one request's fault.
BUSY_TRIES = 60
CONTROL_POLL_S = 0.25


class _LineFields(msgspec.Struct):
    index: int
    finish_reason: str
    max_tokens: int = 0
    attempt: int = 1


class Engine:
    def __init__(self, spec: RunSpec, urls: list[str] | None = None) -> None:
        if spec.generate is None:
            raise SpecError(f"{spec.source}: [generate]: missing")
        self.spec = spec
        self.gen: GenerateSection = spec.generate
        self.run_dir = spec.run_dir
        self.heartbeat = Heartbeat(self.run_dir)
        # Supervised runs pass the URLs of the servers they launched.
        self.urls = urls if urls is not None else list(spec.servers.urls or [])
        self.status = "starting"
        self.stopping = False
        self.message: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._retry_tasks: set[asyncio.Task[None]] = set()
        self._inflight: set[int] = set()
        self._feed_over = False
        self._write_q: asyncio.Queue[tuple[int, int, bytes, BatchLine, str | None]] = (
            asyncio.Queue()
        )
        self._requeue_reason: dict[int, str] = {}
        self._epoch = 0
        self._live = 0  # request tasks not yet finished
        self._idle = asyncio.Event()
        # The request path: jobs in flight by index, the feeder's pass at its end (the tail
        # can start), deadline misses (and those the server confirmed aborted), hedges won,
        # abort_request refusals said once a server; this engine's part of every rid.
        self._jobs: dict[int, Job] = {}
        self._fed = False
        self.deadline_misses = 0
        self.aborts_confirmed = 0
        self.late_answers = 0
        self.busy_answers = 0
        self.lag = LoopLag()
        self.collector = Collector(lambda: self._live)
        self._rid_tag = secrets.token_hex(4)
        self.hedges_won = 0
        self._abort_refused: set[int] = set()
        self.writer_error: str | None = None
        self._lock_fd = -1
        self.uploader: Uploader | None = None
        self.control: Control | None = None
        self._control_mtime: int = -1
        # Where the counted lines end in the store (batch, line): what totals.json says it
        # counted up to; set after each group is counted, on the loop.
        self._counted_at = (0, 0)
        # Why control.json is not being followed (unreadable, out of range), for status.
        self._control_note: str | None = None
        # A campaign node ([queue]): its chunks, leased and committed through S3.
        self.queue: QueueWorker | None = None
        self._store_lock = asyncio.Lock()  # the writer's groups and a commit's batch close
        self._req_tasks: dict[int, asyncio.Task[None]] = {}

    # -- start ------------------------------------------------------------------------------

    def _lock_run_dir(self) -> None:
        self._lock_fd = os.open(self.run_dir / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EngineError(f"{self.run_dir}: another engine is running this run "
                              "(run.lock is held)") from None
        os.ftruncate(self._lock_fd, 0)
        os.write(self._lock_fd, f"{os.getpid()}\n".encode())

    def prepare(self) -> None:
        """Everything that can refuse to start, before any request is sent."""
        make_dirs(self.run_dir)  # a power loss must not take the run's folder with it
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self._lock_run_dir()
        try:
            self._prepare_locked()
        except BaseException:
            # Refused: let the next try (a resume in the same supervisor) take the lock.
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise

    def _prepare_locked(self) -> None:
        _setup_file_log(self.run_dir / "logs" / "generate.log")
        keep_copy(self.spec, self.run_dir)
        self.pin = check_pin(self.spec, self.run_dir)
        if self.spec.s3 is not None:
            check_bucket(self.spec.s3)
        self.store = BatchStore(self.run_dir, self.gen.batch_size, self.pin.prompts_lines)
        rec = self.store.recover()
        self.journal = Journal(self.run_dir / "failures.jsonl")
        self.journal.recover()
        self.journal.watch_done(self.store.done)
        self._load_offsets()
        for i, (ev, _, what) in self.journal.state.last.items():
            if ev == "requeued":
                self._requeue_reason[i] = what
        if self.spec.s3 is not None:
            self.uploader = Uploader(self.spec.s3, self.run_dir)
            self.uploader.recover(rec.closed_batches)
            if self.spec.queue is None:
                # What resume-from-s3 restores, so failed indices stay failed on a new disk.
                self.uploader.watch_journals(RUN_FOLDER, [self.journal.path])
                publish_pin(make_s3_client(self.spec.s3), self.spec.s3, self.pin)
            else:
                # A campaign node: its journals go beside its batches, under its run id.
                self.queue_feed = QueueFeed(self)
                self.queue = self.queue_feed.open()
        self._batches_closed = len(rec.closed_batches)
        progress_raw = None
        try:
            progress_raw = (self.run_dir / "progress.json").read_bytes()
        except FileNotFoundError:
            pass
        # The line totals from the lines themselves (totals.json saves reading those before
        # its point), never from progress.json, which a crash may leave stale or torn.
        counted = recount.recover_totals(self.run_dir, self.store, progress_raw, rec.done)
        recount.log_recount(counted)
        self._counted_at = counted.counted_at
        # GPUs paid for: a server on a group of GPUs holds every one of them.
        gpus = self.spec.servers.gpu_count or len(self.urls)
        self.meter = Meter(counted.totals, gpus=gpus,
                           cost_per_gpu_hour=self.spec.run.cost_per_gpu_hour)
        if counted.record_stale:
            self._sync_totals(self._totals_record())  # the next start need not count again
        bad: str | None
        try:
            self.control = ensure_control(self.run_dir, self.gen.concurrency,
                                          self.gen.max_tokens)
            bad = control_problem(self.control)
        except (ControlError, OSError) as exc:
            bad = str(exc)
        if bad is not None:
            # Nothing applied yet: the last good control is what progress.json says the
            # engine ran with (else run.toml's); the run starts on it, not on a traceback.
            self.control = last_good_control(progress_raw, self.gen.initial_concurrency,
                                             self.gen.max_tokens,
                                             self.journal.state.retry_applied)
            self._control_unusable(bad)
        self._applied_rev = 0
        log.info("recovered %s: %d done, %d failed, open batch %d lines (%d recorded after "
                 "crash, %d torn bytes cut), next batch %d, %d uploads pending",
                 self.run_dir, rec.done, self._failed_count(), rec.open_batch_lines,
                 rec.recorded_after_crash, rec.torn_bytes_cut, rec.next_batch,
                 self.uploader.pending if self.uploader else 0)
        urls = self.urls
        cap = self.gen.max_concurrency
        self.servers = [
            Server(number=n, url=url, limit=self._limit_for(n),
                   client=make_client(url, cap, self.gen.connect_timeout_s,
                                      self.gen.request_timeout_s, self.spec.servers.api_key))
            for n, url in enumerate(urls)
        ]
        self.dispatcher = Dispatcher(self.servers, self.gen.server_failures_to_down,
                                     probe_interval_s=1.0, probe_timeout_s=30.0)
        self.pace = Pace(self.gen.deadline_factor, self.gen.deadline_floor_s,
                         self.gen.request_timeout_s)
        self.hedger = Hedger(self.dispatcher, self.pace, self._send_copy)
        # `resize auto` / concurrency_per_server = "auto": the tuner writes control.json.
        self.autotune = AutoTuner(self.run_dir, self.servers, lambda: self.control,
                                  self.gen.max_concurrency)

    def _capacity(self) -> int:
        return sum(s.limit for s in getattr(self, "servers", [])) or 1

    def _limit_for(self, server: int) -> int:
        assert self.control is not None
        return max(0, min(self.control.concurrency.for_server(server), self.gen.max_concurrency))

    # -- state ------------------------------------------------------------------------------

    def _load_offsets(self, rebuild: bool = False) -> None:
        """The prompts file's offset index (before the loop starts, or in a thread: building
        it reads the whole file)."""
        self.offsets = OffsetIndex.load_or_build(
            self.spec.prompts_path, self.run_dir / OFFSETS_FILE, self.pin.prompts_lines,
            self.pin.prompts_size, rebuild)

    def _to_do(self) -> Iterator[int]:
        """The indices this pass sends, in order: those not done (the done-set's runs of done
        skipped at C speed, never a line read for them) and those requeued past the attempt
        they are done at; each still asked of `_needs` when its turn comes."""
        requeued = sorted(i for i, (ev, _, _) in self.journal.state.last.items()
                          if ev == "requeued" and i in self.store.done)
        for index in heapq.merge(self.store.done.missing(), requeued):
            if self._needs(index):
                yield index

    def _failed_count(self) -> int:
        return self.journal.failed_count()

    def _needs(self, index: int) -> bool:
        if index in self._inflight:
            return False
        last = self.journal.state.last.get(index)
        if index in self.store.done:
            return last is not None and last[0] == "requeued" and \
                self.store.done.attempt(index) < last[1]
        return last is None or last[0] == "requeued"

    def _attempt_for(self, index: int) -> int:
        if self.queue is not None:
            return self.queue.attempt(index)
        last = self.journal.state.last.get(index)
        if last is not None and last[0] == "requeued":
            return last[1]
        return 1

    # -- the run ----------------------------------------------------------------------------

    async def run(self, install_signals: bool = True) -> int:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, sig)
        self._apply_control(self.control, initial=True)
        background = [
            asyncio.create_task(self._writer(), name="writer"),
            asyncio.create_task(self._progress_loop(), name="progress"),
            asyncio.create_task(self._control_loop(), name="control"),
            asyncio.create_task(self.dispatcher.probe_forever(), name="probe"),
            asyncio.create_task(self._hedge_loop(), name="hedge"),
            asyncio.create_task(self.autotune.run(), name="autotune"),
            asyncio.create_task(self.lag.run(), name="loop-lag"),
            asyncio.create_task(self.collector.run(), name="collector"),
        ]
        if self.queue is not None:
            background.append(asyncio.create_task(self.queue.keep(), name="queue-keep"))
        if self.uploader is not None:
            background.append(asyncio.create_task(self.uploader.run(), name="uploader"))
            background.append(asyncio.create_task(self.uploader.journals_loop(),
                                                  name="journals"))
        self.status = "paused" if self.dispatcher.paused else "running"
        try:
            await (self.queue_feed.feed() if self.queue is not None else self._feed())
            self._feed_over = True
            await self._finish()
        finally:
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for s in self.servers:
                await s.client.aclose()
            self.release()
        log.info("engine exits with status %s", self.status)
        return 0 if self.status in ("done", "stopped") else 1

    def release(self) -> None:
        """The engine's end, run or only prepared (a recovery alone): its last totals and
        progress made durable (a power loss after a finished run leaves it finished), its
        files closed, run.lock released."""
        try:
            self._sync_totals(self._totals_record())
            last = self._write_progress(durable=True)
            if last is not None and self.status in ("done", "stopped", "failed"):
                # The run's end is in its history too (a report, a replay), not only a
                # sample up to 10 s before it.
                self.heartbeat.append_history(last)
        finally:
            self.store.close()
            self.journal.close()
            if self.queue is not None:
                self.queue.close()
            if self.uploader:
                self.uploader.close()
            self.heartbeat.close()
            if self._lock_fd >= 0:
                # Released, so the supervisor's next engine (stop, then resume) can take it.
                os.close(self._lock_fd)
                self._lock_fd = -1

    def set_server_state(self, number: int, healthy: bool) -> None:
        """A supervisor's word on a server: route to it or not (its health is authoritative)."""
        for s in self.servers:
            if s.number == number:
                s.state = "healthy" if healthy else "down"
                if healthy:
                    s.errors_in_row = 0
                self._spawn(self.dispatcher.notify())

    def request_stop(self, sig: int | None = None) -> None:
        if not self.stopping:
            log.info("stop requested (%s): draining", signal.Signals(sig).name if sig else "rpc")
            self.stopping = True
            self.status = "draining"
            asyncio.get_running_loop().create_task(self.dispatcher.close())
            self._idle.set()

    async def _feed(self) -> None:
        while not self.stopping:
            epoch = self._epoch
            self._fed = False
            try:
                if not await self._feed_pass():
                    return
            except StaleOffsets as exc:
                await self._offsets_stale(exc)
                continue  # the pass again: what is done or in flight is not sent twice
            # The pass is over: wait for what is in flight, then see whether retries came in.
            self._fed = True
            while self._live and not self.stopping:
                self._idle.clear()
                await self._idle.wait()
            if self._retry_tasks:
                await asyncio.gather(*self._retry_tasks, return_exceptions=True)
            # Lines still queued are not in the done-set yet: a new pass must not see them
            # as to do.
            await self._join_writer()
            if self._epoch == epoch and not self.stopping and not self._retry_tasks:
                return

    async def _feed_pass(self) -> bool:
        """One pass over what is to do, each line to a request once a server has room; False
        when the run stops meanwhile."""
        scanned = 0
        stream = self.offsets.read(self.spec.prompts_path, self._to_do(),
                                   self.gen.max_prompt_bytes)
        for index, raw in stream:
            if self.stopping:
                return False
            server = await self.dispatcher.acquire()
            if server is None:
                return False
            try:
                prompt = prompt_io.parse_prompt(index, raw)
            except prompt_io.BadPrompt as exc:
                await self.dispatcher.release(server)
                await self._journal([failed(index, "bad_input", f"line {index + 1}: {exc}",
                                            0, None, line=index + 1)])
                log.warning("prompts line %d (index %d): bad_input: %s", index + 1, index, exc)
                continue
            self._inflight.add(index)
            self._live += 1
            task = asyncio.create_task(self._request(prompt, server, self._attempt_for(index)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            scanned += 1
            if scanned % FEED_YIELD == 0:
                await asyncio.sleep(0)
        return True

    async def _offsets_stale(self, exc: StaleOffsets) -> None:
        """A line read through the offset index did not match the prompts file (the index
        edited, or left by another file): built again from the file, and the pass goes on."""
        log.warning("%s; building the offset index again", exc)
        await asyncio.to_thread(self._load_offsets, True)

    def _dispatch(self, index: int, raw: bytes | prompt_io.TooLong, server: Server,
                  attempt: int) -> None:
        """One line to a request on `server` (a slot already taken), or its bad_input."""
        try:
            prompt = prompt_io.parse_prompt(index, raw)
        except prompt_io.BadPrompt as exc:
            self._spawn(self._bad_input(index, exc, server, attempt))
            return
        self._inflight.add(index)
        self._live += 1
        task = asyncio.create_task(self._request(prompt, server, attempt))
        self._tasks.add(task)
        self._req_tasks[index] = task
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(functools.partial(self._request_over, index))

    def _request_over(self, index: int, task: asyncio.Task[None]) -> None:
        if self._req_tasks.get(index) is task:
            del self._req_tasks[index]

    async def _bad_input(self, index: int, exc: Exception, server: Server, attempt: int) -> None:
        await self.dispatcher.release(server)
        await self._journal([failed(index, "bad_input", f"line {index + 1}: {exc}", 0, None,
                                    attempt, line=index + 1)])
        log.warning("prompts line %d (index %d): bad_input: %s", index + 1, index, exc)

    async def _request(self, prompt: prompt_io.Prompt, server: Server | None, attempt: int) -> None:
        """One request to its end: its line queued for the writer, or `failed` journaled.
        Each try is a copy on a server, given up at its deadline (requeued, reason
        `deadline`, against `retries`); at the tail the hedger may add a copy elsewhere. The
        job yields one answer, so there is one line per index and attempt."""
        job = Job(prompt.index, attempt, self._rid_tag)
        self._jobs[prompt.index] = job
        tries = 0
        busy = 0  # "later" answers (BUSY_TRIES at most before they count as tries)
        queued = False  # once queued for the writer, the writer clears _inflight
        try:
            while server is not None:
                tries += 1
                assert self.control is not None
                job.max_tokens = self.control.max_tokens
                if self.queue is not None:
                    # A retry generation runs at its own max_tokens when that is higher.
                    job.max_tokens = max(job.max_tokens,
                                         self.queue.max_tokens_for(prompt.index) or 0)
                job.payload = build_request(prompt, self.spec.model_name, job.max_tokens,
                                            self.gen.sampling, self.gen.chat_template_kwargs)
                self._send_copy(job, server, False)
                outcome = await job.settle()
                server = outcome.server
                result = outcome.completion
                if result is None:
                    exc = outcome.error
                    assert exc is not None
                    if exc.busy and busy < BUSY_TRIES:
                        # The server said "later" (its queue is full): not a try used up.
                        busy += 1
                        tries -= 1
                        self.busy_answers += 1
                        await asyncio.sleep(min(0.25 * 2 ** min(busy - 1, 6), 10.0))
                        server = await self.dispatcher.acquire(avoid=server.number, retry=True)
                        continue
                    if not exc.retryable or tries >= self.gen.retries:
                        server.failed += 1
                        await self._journal([failed(prompt.index, exc.error, exc.message, tries,
                                                    server.number, attempt)])
                        return
                    if exc.error == "deadline":
                        # Durable before it goes out again, as every requeue is.
                        await self._journal([requeued(prompt.index, attempt, "deadline",
                                                      server.number, exc.message)])
                    self.meter.totals.retried += 1
                    await asyncio.sleep(min(0.2 * 2 ** (tries - 1), 10.0))
                    server = await self.dispatcher.acquire(avoid=server.number, retry=True)
                    continue
                self.dispatcher.record_success(server)
                server.count_completion(result.completion_tokens, result.spec_verify_ct,
                                        result.latency_s)
                self.hedges_won += outcome.hedge
                line = BatchLine(
                    index=prompt.index, id=prompt.id, messages=prompt.messages, tools=prompt.tools,
                    reasoning_content=result.reasoning_content, content=result.content,
                    tool_calls=result.tool_calls, finish_reason=result.finish_reason,
                    usage=Usage(result.prompt_tokens, result.completion_tokens,
                                result.reasoning_tokens),
                    model=self.spec.model_name, sampling=self.gen.sampling,
                    chat_template_kwargs=self.gen.chat_template_kwargs,
                    max_tokens=job.max_tokens, server=server.number,
                    latency_s=round(result.latency_s, 3), spec_verify_ct=result.spec_verify_ct,
                    attempt=attempt, hedged=bool(outcome.hedge),
                )
                await self._write_q.put((prompt.index, attempt, encoder.encode(line) + b"\n",
                                         line, self._requeue_reason.get(prompt.index)))
                queued = True
                if job.hedges:
                    crash_point("hedge_won")  # tests: killed while the loser is aborted
                return
        finally:
            job.cancel()  # drained, or lost: the copies still out are aborted
            if self._jobs.get(prompt.index) is job:
                del self._jobs[prompt.index]
            if not queued:
                self._inflight.discard(prompt.index)
            self._live -= 1
            if self._live == 0:
                self._idle.set()

    def _send_copy(self, job: Job, server: Server, hedge: bool) -> None:
        """Send the job's request to `server` (a slot the caller acquired, released when the
        copy ends)."""
        rid = job.next_rid()
        task = asyncio.get_running_loop().create_task(self._copy(job, server, rid))
        job.add(server, task, hedge, rid)
        if hedge:
            log.info("index %d attempt %d: hedged on server %d after %.1f s",
                     job.index, job.attempt, server.number, time.monotonic() - job.started)
            crash_point("hedge_sent")  # tests: killed with two copies out

    async def _copy(self, job: Job, server: Server, rid: str) -> Completion:
        assert job.payload is not None
        max_tokens = job.max_tokens
        past_deadline = False

        async def give_up() -> bool:
            nonlocal past_deadline
            past_deadline = True
            return await self._abort_now(server, rid)

        sent_at = time.monotonic()
        payload = {**job.payload, "rid": rid}
        try:
            if self.gen.deadline_factor > 0:
                result = await send_within(server.client, payload,
                                           lambda: self.pace.longest(server.number, max_tokens,
                                                                     sent_at),
                                           self.gen.deadline_factor, give_up, self.pace.changed)
            else:  # no deadlines: request_timeout_s alone
                result = await chat(server.client, payload)
        except RequestFailed as exc:
            if isinstance(exc, DeadlineMiss):
                self.deadline_misses += 1
                if exc.tokens is not None:
                    self.aborts_confirmed += 1
                    self.pace.observe_aborted(server.number, exc.tokens, exc.elapsed_s)
                log.warning("index %d attempt %d on server %d: %s", job.index, job.attempt,
                            server.number, exc.message)
            elif exc.error in ("timeout", "transport"):
                # The server may still run it: SGLang notices a closed connection only at
                # its next disconnect check (every 4 s), and keeps the rid until then.
                self._abort(server, rid)
            if exc.server_fault and self.dispatcher.record_failure(
                server, f"{exc.error}: {exc.message}", exc.error == "connect"
            ):
                log.warning("server %d (%s) set aside: %s", server.number, server.url, exc)
            raise
        except asyncio.CancelledError:
            self._abort(server, rid)  # another copy answered first, or the run drains
            raise
        finally:
            await self.dispatcher.release(server)  # never leak a server slot
        if past_deadline:
            # It ended before our abort reached it (SGLang still counts the abort): kept.
            self.late_answers += 1
            log.info("index %d attempt %d on server %d: answered after %.1f s, past its "
                     "deadline, while its abort was on the way: the answer stands", job.index,
                     job.attempt, server.number, result.latency_s)
        self.pace.observe(server.number, result.completion_tokens, result.latency_s)
        return result

    def _abort(self, server: Server, rid: str) -> None:
        """SGLang's /abort_request for a request given up on, in the background (best
        effort: the server also aborts when it sees the connection closed)."""
        self._spawn(self._abort_now(server, rid))

    async def _abort_now(self, server: Server, rid: str) -> bool:
        """/abort_request for `rid`; True when the server took it (200)."""
        status = await abort(server.client, rid, self.spec.servers.admin_api_key)
        if status in (401, 403) and server.number not in self._abort_refused:
            self._abort_refused.add(server.number)
            log.warning("server %d (%s) refused /abort_request (HTTP %d): set [servers] "
                        "admin_api_key to its --admin-api-key; until then a request given "
                        "up on runs there until SGLang sees its connection closed",
                        server.number, server.url, status)
        return status == 200

    @property
    def tail(self) -> bool:
        """The work left is smaller than the capacity in flight: every request is out and
        servers stand idle, so the oldest may be hedged."""
        if not self._fed or not self._live or self.stopping or self.dispatcher.paused:
            return False
        return self._live < sum(s.limit for s in self.servers if s.state == "healthy")

    async def _hedge_loop(self) -> None:
        """At the tail, hedge; looks again at an eighth of the median answer's time."""
        while True:
            median = self.pace.median_latency()
            await asyncio.sleep(min(max((median or 1.0) / 8, 0.01), 0.5))
            if self.gen.hedge and self.tail:
                try:
                    self.hedger.hedge(self._jobs.values())
                except Exception:  # a bug here must not end hedging unseen, nor the run
                    log.exception("hedging failed; the run goes on without this round")

    def server_figures(self, number: int, load: ServerLoad) -> None:
        """SGLang's own figures for a server (the supervisor reads /metrics and the decode
        log): its pace before it has answered and the waits deadlines allow for (its queue,
        its retractions), and what the auto-tuner checks a level against."""
        self.pace.observe_load(number, load)
        self.autotune.observe(number, load)

    async def _journal(self, events: list[Any]) -> None:
        """Append to failures.jsonl, all or nothing. When it cannot be written (a full disk)
        the events are lost, which loses nothing: their indices stay to do and a resume
        sends them again; the run stops."""
        try:
            await asyncio.to_thread(self.journal.append, events)
        except OSError as exc:
            self._stop_on_write_error(f"cannot write {self.journal.path}", exc)
            return
        if self.uploader is not None:
            self.uploader.journals_changed()
        if self.queue is not None:
            for ev in events:
                if ev.event == "failed" and ev.index is not None:
                    self.queue.resolved(ev.index, ev.attempt or 1)

    async def _join_writer(self) -> None:
        """Wait until every queued line is on disk (or dropped after a write failure)."""
        await self._write_q.join()

    async def _writer(self) -> None:
        q = self._write_q
        while True:
            group = [await q.get()]
            while len(group) < 1024:
                try:
                    group.append(q.get_nowait())
                except asyncio.QueueEmpty:
                    break
            if self.writer_error is not None:
                # After a failed write nothing more is written: these lines are not durable,
                # so they stay to do and a resume sends them again.
                for i, _, _, _, _ in group:
                    self._inflight.discard(i)
                    q.task_done()
                continue
            try:
                async with self._store_lock:
                    closed, loops = await asyncio.to_thread(self._write_and_judge, group)
            except OSError as exc:
                # A full disk, a failing device: the store cut the failed piece back to the
                # last durable offset; what it committed before (a batch the group filled)
                # counts. Stop; a resume redoes the rest.
                done = self.store.done
                kept = [g for g in group if done.has(g[0], g[1])]
                # Stopping: the few kept lines are judged here, once.
                self._count(kept, loops_in(kept))
                if self.queue is not None:
                    for i, a, _, _, _ in kept:
                        self.queue.resolved(i, a)
                self._counted_at = (self.store.next_number, self.store.open_lines)
                self._closed(self.store.closed_in_failed_group)
                for i, _, _, _, _ in group:
                    self._inflight.discard(i)
                for _ in group:
                    q.task_done()
                self._stop_on_write_error(f"cannot write {self.store.folder}", exc)
                continue
            for i, _, _, _, _ in group:
                self._inflight.discard(i)
            self._count(group, loops)
            self._counted_at = (self.store.next_number, self.store.open_lines)
            self._closed(closed)
            if self.queue is not None:
                for i, a, _, _, _ in group:
                    self.queue.resolved(i, a)
            for _ in group:
                q.task_done()

    def _write_and_judge(self, group: list[tuple[int, int, bytes, BatchLine, str | None]]
                         ) -> tuple[list[ClosedBatch], set[int]]:
        """In the writer's thread: the group durably, then which of its truncated lines are
        loops (after the fsync, so durability never waits for it; never on the loop)."""
        closed = self.store.write_group([(i, a, raw) for i, a, raw, _, _ in group])
        return closed, loops_in(group)

    def _count(self, group: list[tuple[int, int, bytes, BatchLine, str | None]],
               loops: set[int]) -> None:
        """Durable lines into the totals, by the rule a recount after a crash follows
        (`loops`: the indices of the group's truncated lines that ended in a loop)."""
        t = self.meter.totals
        for index, attempt, _, line, _ in group:
            u = line.usage
            t.add_line(u.prompt_tokens, u.completion_tokens, u.reasoning_tokens,
                       line.finish_reason, line.max_tokens, attempt,
                       not line.content and not line.tool_calls, index, index in loops)
            self.meter.rate.add()

    def _stop_on_write_error(self, what: str, exc: OSError) -> None:
        """A write the run cannot go on without failed (a full disk): stop, status failed."""
        if self.writer_error is not None:
            return
        self.writer_error = f"{what}: {exc.strerror or exc}"
        self.message = (f"{self.writer_error}; stopped. Completed lines already on disk are "
                        "safe; free space, then resume.")
        log.error(self.message)
        self.request_stop()

    def _closed(self, closed: list[ClosedBatch]) -> None:
        for batch in closed:
            self._batches_closed += 1
            log.info("closed %s (%d lines, %d bytes)", batch.path.name, batch.lines, batch.size)
            if self.uploader is not None:
                self.uploader.submit(batch.path, batch.sha256)

    async def _finish(self) -> None:
        """Drain what is in flight, close the open batch, wait for uploads, set the status."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks),
                                               timeout=self.gen.drain_timeout_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._join_writer()
        try:
            closed = await asyncio.to_thread(self.store.close_open_batch)
            self._closed([closed] if closed else [])
        except OSError as exc:
            self.writer_error = self.writer_error or f"cannot close the open batch: {exc}"
            log.error("the open batch stays open: %s", exc)
        if self.uploader is not None and self.uploader.pending:
            self.status = "draining"
            self._write_progress()
            if not await self.uploader.drain(3600.0, stop=lambda: self.stopping):
                self.message = (f"{self.uploader.pending} batch(es) not yet in S3 "
                                f"({self.uploader.last_error}); a resume uploads them")
                log.warning(self.message)
        if self.uploader is not None and not await self.uploader.drain_journals(60.0):
            self.message = self.message or (
                f"the journals are not yet in S3 ({self.uploader.last_error}); a resume "
                "uploads them")
            log.warning("journals not uploaded: %s", self.uploader.last_error)
        if self.queue is not None:
            await self.queue_feed.finish()
        if self.writer_error is not None:
            self.status = "failed"
        elif self.queue is not None and not self.stopping and not self.queue.finished:
            self.status = "stopped"
        else:
            self.status = "stopped" if self.stopping else "done"

    # -- control ----------------------------------------------------------------------------

    def _apply_control(self, control: Control | None, initial: bool = False) -> None:
        if control is None or (control.rev <= self._applied_rev and not initial):
            return
        self.control = control
        self._applied_rev = control.rev
        for s in self.servers:
            s.limit = self._limit_for(s.number)
        self.dispatcher.paused = control.paused
        if not self.stopping:
            self.status = "paused" if control.paused else "running"
        self._spawn(self.dispatcher.notify())
        if not initial:
            log.info("control rev %d applied: concurrency %s, max_tokens %d, paused %s",
                     control.rev, control.concurrency, control.max_tokens, control.paused)
        applied = self.journal.state.retry_applied
        if self.queue is not None:
            if control.retry.failed > applied.get("failed", 0) or \
                    control.retry.truncated > applied.get("truncated", 0) or \
                    control.retry.long > applied.get("long", 0):
                self._control_note = ("retry is the campaign's on a queue node: `fleetdeck "
                                      "retry CAMPAIGN failed|truncated` makes a generation "
                                      "every node runs; this node's own retry is not applied")
                log.warning(self._control_note)
            return
        if control.retry.failed > applied.get("failed", 0):
            self._spawn_retry(self._retry_failed(control.retry.failed))
        if control.retry.truncated > applied.get("truncated", 0):
            self._spawn_retry(self._retry_truncated(control.retry.truncated, control.max_tokens))
        if control.retry.long > applied.get("long", 0):
            self._spawn_retry(self._retry_truncated(control.retry.long, control.max_tokens,
                                                    long_only=True))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _spawn_retry(self, coro: Any) -> None:
        """A retry being prepared keeps the run open until its indices are queued."""
        task = asyncio.get_running_loop().create_task(coro)
        self._retry_tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._retry_tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.message = f"a retry request failed: {t.exception()!r}; issue it again"
                log.error(self.message)

        task.add_done_callback(done)

    async def _control_loop(self) -> None:
        path = self.run_dir / "control.json"
        while True:
            await asyncio.sleep(CONTROL_POLL_S)
            try:
                mtime = path.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            if mtime == self._control_mtime:
                continue
            self._control_mtime = mtime
            try:
                control = read_control(self.run_dir)
            except (ControlError, OSError) as exc:
                self._control_unusable(str(exc))
                continue
            bad = control_problem(control) if control is not None else None
            if bad is not None:
                self._control_unusable(f"{path}: {bad}")
                continue
            if self._control_note is not None:
                log.info("control.json is readable again")
                self._control_note = None
            self._apply_control(control)

    def _control_unusable(self, why: str) -> None:
        """control.json cannot be followed: keep the last good control, say so in status and
        the log, go on."""
        c = self.control
        kept = (f"rev {c.rev}: max_tokens {c.max_tokens}, concurrency {c.concurrency.default}"
                f"{', paused' if c.paused else ''}") if c is not None else "none yet"
        self._control_note = (f"control.json ignored ({why}); the engine keeps the last good "
                              f"control ({kept}) and goes on; control verbs need control.json "
                              "readable again")
        log.error(self._control_note)

    async def _retry_failed(self, rev: int) -> None:
        indices = self.journal.failed_indices()
        indices = [i for i in indices if i not in self.store.done]
        events = [requeued(i, 1, "failed") for i in indices]
        events.append(retry_applied("failed", rev))
        await self._journal(events)
        for i in indices:
            self._requeue_reason[i] = "failed"
        log.info("retry failed (rev %d): %d indices requeued", rev, len(indices))
        self._wake_feeder()

    async def _retry_truncated(self, rev: int, max_tokens: int, long_only: bool = False
                               ) -> None:
        """`long_only`: leave out the lines that ended in a loop (their bit in the totals,
        set from the same lines a recount reads): more tokens buy a loop nothing."""
        # The live bits, not a copy: a line counted while the scan runs is judged by its bit
        # too (the bytearray only grows; the thread reads single bytes). Left: a line the
        # scan reads between its fsync and its count (a millisecond) counts as long.
        looped = self.meter.totals.looped if long_only else None
        found = await asyncio.to_thread(find_truncated, self.store.folder, self.store.done,
                                        self._inflight, max_tokens, looped)
        events = [requeued(i, a + 1, "truncated") for i, a in found]
        events.append(retry_applied("long" if long_only else "truncated", rev))
        await self._journal(events)
        for i, _ in found:
            self._requeue_reason[i] = "truncated"
        log.info("retry truncated%s (rev %d): %d indices requeued at max_tokens %d",
                 " --long-only" if long_only else "", rev, len(found), max_tokens)
        self._wake_feeder()

    def _wake_feeder(self) -> None:
        self._epoch += 1
        self._idle.set()

    # -- progress ---------------------------------------------------------------------------

    def snapshot(self) -> Progress:
        return progress_of(self)

    def _totals_record(self) -> recount.TotalsRecord:
        """On the loop: the totals and the point in the store they count up to, together."""
        return recount.record_of(self.meter.totals, self._counted_at, self.meter.gpu_hours())

    def _sync_totals(self, rec: recount.TotalsRecord) -> None:
        self.heartbeat.sync_totals(rec)

    def _write_progress(self, durable: bool = False) -> bytes | None:
        """progress.json from a fresh snapshot; the bytes written, None when they could not
        be."""
        return self.heartbeat.write(encoder.encode(self.snapshot()), durable)

    async def _progress_loop(self) -> None:
        while True:
            now = time.monotonic()
            self.meter.rate.tick(now)
            for s in self.servers:
                s.req_rate.tick(now)
                s.tok_rate.tick(now)
            # Encoded on the loop (a consistent snapshot), written in a thread: the write and
            # its fsync once held the loop for most of a second on a busy disk.
            snap = encoder.encode(self.snapshot())
            written = await asyncio.to_thread(self.heartbeat.write, snap)
            await self.heartbeat.beat(written, now, self._totals_record)
            await asyncio.sleep(PROGRESS_INTERVAL_S)


class _LogFile(logging.FileHandler):
    """generate.log; a full disk costs log lines, not a traceback on stderr per line."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            print(f"fleetdeck-agent generate: cannot write {self.baseFilename}; "
                  "later log lines go to stderr only", file=sys.stderr)


def _setup_file_log(path: Path) -> None:
    root = logging.getLogger("fleetdeck")
    if any(isinstance(h, logging.FileHandler) and h.baseFilename == str(path)
           for h in root.handlers):
        return
    handler = _LogFile(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def raise_open_files() -> None:
    """The soft open-files limit up to the hard one: a socket per request in flight (10,000
    and more through a router), and the default soft limit is often 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files limit stays %d (hard %d): %s", soft, hard, exc)


def run_engine(spec: RunSpec) -> int:
    raise_open_files()
    engine = Engine(spec)
    engine.prepare()
    settle_heap()
    return event_loop_runner()(engine.run())


def event_loop_runner() -> Any:
    """uvloop's runner, asyncio's where uvloop is missing or FLEETDECK_LOOP=asyncio: measured,
    uvloop took ~17% less of the engine's CPU per completion (benchmarks/dispatch.py)."""
    if os.environ.get("FLEETDECK_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run
    return asyncio.run


def loops_in(group: list[tuple[int, int, bytes, BatchLine, str | None]]) -> set[int]:
    """The indices of a group's truncated lines whose text ends in a loop (loops.py)."""
    return {i for i, _, _, line, _ in group if line.finish_reason == "length"
            and is_loop(answer_tail(line.content, line.reasoning_content))}
