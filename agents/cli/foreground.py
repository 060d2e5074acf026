"""`fleetdeck-agent up --wait`: a supervised run held in the foreground until its job ends, for
a scheduler's task (a Slurm array task, a SkyPilot task); the job's fate is the exit status."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import dataclass

import msgspec

from agents.cli.exits import EXIT_FAILED, EXIT_GAVE_UP, EXIT_LOST, EXIT_OK, EXIT_STOPPED
from agents.rpc.protocol import RpcClient, RpcError
from agents.rundir.schema import Snapshot
from agents.rundir.spec import RunSpec
from agents.supervise.launch import (
    RunCtlError,
    call,
    prepare_up,
    spawn_supervisor,
    wait_for_supervisor,
)
from agents.supervise.procinfo import exit_status
from agents.supervise.servers import ServerSet
from agents.supervise.snapshot import from_disk


class StatusPush(msgspec.Struct):
    """A line the supervisor pushes to a subscriber; `params` is a snapshot for `status`."""

    method: str = ""
    params: Snapshot | None = None


push_decoder = msgspec.json.Decoder(StatusPush)


@dataclass
class Ending:
    code: int
    line: str  # the one line said at the end: how the run ended, and where its run dir is


class Foreground:
    """One `up --wait`: the supervisor started with --down-after-job, its status pushes read
    until its socket closes, its exit code taken; SIGTERM or SIGINT asks it down (the job
    drains), a second one stops the waiting."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.run_dir = spec.run_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.signals: list[str] = []
        self.last: Snapshot | None = None
        self._answered = asyncio.Event()  # the supervisor said hello: `down` can reach it
        self._stop_sent = False
        self._gave_up = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> Ending:
        """Raises RunCtlError when the run does not start (as `up` does)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await prepare_up(self.spec)
            self.proc = spawn_supervisor(self.run_dir, down_after_job=True)
            watch = asyncio.create_task(self._watch(self.proc))
            gave_up = asyncio.create_task(self._gave_up.wait())
            await asyncio.wait({watch, gave_up}, return_when=asyncio.FIRST_COMPLETED)
            gave_up.cancel()
            if watch.done():
                return watch.result()
            watch.cancel()
            return self._given_up(self.proc)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    # -- signals ------------------------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        self.signals.append(signal.Signals(sig).name)
        if len(self.signals) == 1:
            task = asyncio.ensure_future(self._stop())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._gave_up.set()

    async def _stop(self) -> None:
        """The drain: `down`, as `fleetdeck-agent down` asks it (audited): the job stops
        cleanly (the engine finishes what is in flight, closes its batch, uploads), then the
        servers and the supervisor go. Before the supervisor answers, the ask waits for it:
        a SIGTERM before its own handler is set would kill it mid-start."""
        await self._answered.wait()
        try:
            await call(self.run_dir, "down", {})
        except (RunCtlError, RpcError, OSError, TimeoutError):
            # Its socket is gone or wedged: its SIGTERM handler takes the same path.
            if self.proc is not None and self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
        self._stop_sent = True

    # -- waiting ------------------------------------------------------------------------------

    async def _watch(self, proc: subprocess.Popen[bytes]) -> Ending:
        client = await wait_for_supervisor(self.run_dir, proc)
        try:
            self.last = msgspec.convert(await client.call("subscribe"), Snapshot)
        except (RpcError, ConnectionError, TimeoutError, msgspec.ValidationError):
            pass  # the pushes, or the run directory at the end, say what happened
        self._answered.set()
        await self._read_pushes(client)
        code = await exit_status(proc)
        if code != 0:
            return await self._lost(proc, code)
        return self._ended()

    async def _read_pushes(self, client: RpcClient) -> None:
        """Status pushes (one a second) until the socket closes: the supervisor's exit (its
        last push comes after the job and the servers ended) or its death."""
        try:
            while line := await client.reader.readline():
                try:
                    push = push_decoder.decode(line)
                except msgspec.DecodeError:
                    continue
                if push.method == "status" and push.params is not None:
                    self.last = push.params
        except (ConnectionError, OSError, ValueError):
            pass  # a reset is the same news as a close
        finally:
            await client.close()

    # -- the end --------------------------------------------------------------------------------

    def _ended(self) -> Ending:
        snap = self.last
        if snap is None or snap.source != "supervisor":
            snap = from_disk(self.run_dir, self.spec.run.kind, self.spec.run.name)
        where = f"run dir {self.run_dir}"
        if snap.status == "failed":
            return Ending(EXIT_FAILED, f"{self._name} failed: {snap.message or 'no reason'} "
                          f"({self._counts(snap)}); {where}")
        if snap.status == "done" and self._ran_here(snap):
            return Ending(EXIT_OK, f"{self._name} done ({self._counts(snap)}); {where}")
        how = f"on {self.signals[0]}, drained" if self.signals else \
            "by a stop or down from elsewhere"
        return Ending(EXIT_STOPPED, f"{self._name} stopped {how} ({self._counts(snap)}); "
                      f"{where}; the same `up --wait` again continues it")

    def _ran_here(self, snap: Snapshot) -> bool:
        """A `done` is this job's own, not the word a run stopped during start-up keeps from
        its last engine (whose progress names another supervisor's pid)."""
        if snap.kind != "generate":
            return True
        return snap.progress is not None and snap.progress.pid == snap.supervisor_pid

    async def _lost(self, proc: subprocess.Popen[bytes], code: int) -> Ending:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else \
            f"exited with {code}"
        stopped = await self._stop_servers_left()
        servers = f"; stopped the servers it left ({', '.join(map(str, stopped))})" \
            if stopped else ""
        return Ending(EXIT_LOST, f"{self._name}: its supervisor (pid {proc.pid}) {how} "
                      f"before the run ended{servers}; see {self.run_dir}/logs/supervisor.log; "
                      "the same `up --wait` again continues the run")

    async def _stop_servers_left(self) -> list[int]:
        """A server started by the dead supervisor runs on in a session of its own, holding
        its GPUs: stopped here, as the task that gives the machine back ends."""
        if not self.spec.servers.gpus:
            return []
        servers = ServerSet(self.spec, self.run_dir)
        try:
            return await servers.stop_left()
        finally:
            await servers.close()

    def _given_up(self, proc: subprocess.Popen[bytes]) -> Ending:
        if not self._stop_sent and proc.poll() is None:
            # Not yet asked down (it had not answered yet): its own handler takes it down.
            os.kill(proc.pid, signal.SIGTERM)
        return Ending(EXIT_GAVE_UP, f"{self._name}: a second {self.signals[-1]}: not waiting "
                      f"for the drain; its supervisor (pid {proc.pid}) goes on taking the job "
                      f"and the servers down; run dir {self.run_dir}")

    @property
    def _name(self) -> str:
        return self.spec.run.name

    @staticmethod
    def _counts(snap: Snapshot) -> str:
        p = snap.progress
        if p is not None:
            return f"{p.completed} of {p.total} completed, {p.failed} failed"
        if snap.train is not None:
            return f"step {snap.train.step}"
        return "nothing generated"


async def up_and_wait(spec: RunSpec) -> Ending:
    return await Foreground(spec).run()


__all__ = ["Ending", "Foreground", "up_and_wait"]
