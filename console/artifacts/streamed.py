"""The streamed data path of `fleetdeck pull`: the node's agent sends the files as one framed
stream (`fleetdeck-agent send-files`, agents/artifacts/send.py) through OpenSSH's `ssh`, as
rsync runs its remote half; here each stream is read in a thread that writes the parts, hashes
the bytes as they pass and starts their write-back.

Against OpenSSH's sftp (console/artifacts/opensftp.py): no request per 255 KiB and no second
read of the part for its hash; the file list is one JSON line per file, so a name sftp's batch
file cannot hold (a newline) streams too. Files are split over a few streams, balanced by
bytes as sftp's batches are, each stream asking for its small files first: they land (an
fsync and a rename each, mostly waiting on the disk) while its big ones still come.

The node is trusted with nothing: it answers in the order asked with a header line per file;
a header that is not the one expected, a count over what was asked, or a stream that ends
early stops that stream (what arrived stays in the part, for the next pull to resume) and every
file is checked against the manifest's sha256 by the caller, as on every path.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import io
import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from agents.artifacts.send import MAGIC
from console.artifacts import opensftp
from console.artifacts.landing import Hashed, start_writeback
from console.artifacts.opensftp import FetchResult, Job
from console.fleet import Node
from console.localproc import die_with_parent
from console.openssh import client_options
from console.transport import agent_command

# Bytes read from the pipe at a time, and written and hashed at a time.
BLOCK = 1 << 20
# Write-back is started every this many bytes of a part (see pull.Hashed).
WRITEBACK = 8 * 1024 * 1024
MAX_HEADER = 64 * 1024
PIPE_BYTES = 1 << 20
# The reader's own buffer, for the header lines: a file's bytes past what it holds are read
# straight into the block (readinto1: one read of the pipe, no copy through the buffer).
HEAD_BUFFER = 64 * 1024
STDERR_KEEP = 2000


def find_ssh() -> str | None:
    import shutil

    return shutil.which("ssh")


def ssh_command(ssh: str, node: Node) -> list[str]:
    """ssh to the node running `fleetdeck-agent send-files RUN_DIR`."""
    host = node.host or ""
    return [ssh, "-q", "-o", "BatchMode=yes", "-o", "ForwardAgent=no", "-o", "ForwardX11=no",
            *client_options(node), "-c", opensftp.CIPHERS, "-T", "--", host,
            agent_command(node, "send-files", node.run_dir)]


def plan(jobs: list[Job], procs: int) -> list[list[Job]]:
    """sftp's byte-balanced batches (opensftp.plan), each smallest first."""
    return [batch[::-1] for batch in opensftp.plan(jobs, procs)]


def request_line(rel: str, offset: int, length: int) -> bytes:
    """One line of the request: a name that is not UTF-8 goes as its bytes in base64."""
    req: dict[str, object] = {"offset": offset, "length": length}
    try:
        rel.encode()
        req["path"] = rel
    except UnicodeEncodeError:
        req["raw"] = base64.b64encode(os.fsencode(rel)).decode()
    return json.dumps(req).encode() + b"\n"


class StreamError(Exception):
    """The stream broke its protocol, or ended early."""


class StreamFetcher:
    """Runs the streams for one round of files, as opensftp.SftpFetcher runs sftp processes
    (same calls, same results); `in_flight` is what they are on now. Each job's sha256, taken
    as its bytes arrived, is left in `hashed[job]` (a pull.Hashed) for the check."""

    data_path = "stream"
    hashes_inline = True  # each part's sha256 is in `hashed` when its job is done

    def __init__(self, ssh: str, node: Node, procs: int | None = None) -> None:
        self.ssh = ssh
        self.node = node
        self.procs = procs or opensftp.PROCS  # read here: a patched constant counts
        self.in_flight: set[Job] = set()
        self.hashed: dict[Job, Hashed] = {}
        self._ready: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []  # prestarted

    def prestart(self) -> None:
        """Start the streams' ssh processes now: each logs in and starts its agent while the
        caller reads the manifest and looks at what is here already; `fetch` takes them (one
        that failed says why there, as one started then would). `close` ends those unused."""
        while len(self._ready) < self.procs:
            spawned = self._spawn()
            if isinstance(spawned, str):
                return
            self._ready.append(spawned)

    def _spawn(self) -> tuple[subprocess.Popen[bytes], IO[bytes]] | str:
        """An ssh process running the node's send-files, waiting for its requests; or why
        it could not be run."""
        errlog = tempfile.TemporaryFile()  # noqa: SIM115  (closed by close() or _batch)
        try:
            # Started from this (the loop's) thread: die_with_parent follows the starting
            # thread. Its own session, so a cancel kills its whole group.
            proc = subprocess.Popen(ssh_command(self.ssh, self.node), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=errlog,
                                    start_new_session=True, preexec_fn=die_with_parent(),
                                    bufsize=0)
        except OSError as exc:
            errlog.close()
            return f"cannot run {self.ssh}: {exc}"
        assert proc.stdout is not None
        _widen_pipe(proc.stdout.fileno())
        return proc, errlog

    async def close(self) -> None:
        """The prestarted processes no fetch took: ended (their agents see EOF)."""
        ready, self._ready = self._ready, []
        for proc, errlog in ready:
            _kill_group(proc)
            await asyncio.to_thread(proc.wait)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            errlog.close()

    @staticmethod
    def usable() -> bool:
        return True

    @staticmethod
    def can_name(rel: str) -> bool:
        return True

    async def fetch(self, jobs: list[Job], cwd: Path, scratch: Path,
                    on_done: Callable[[Job, str | None], None]) -> FetchResult:
        if not jobs:
            return FetchResult(True, [], "")
        scratch.mkdir(parents=True, exist_ok=True)
        batches = plan(jobs, self.procs)
        said = await asyncio.gather(*(self._batch(b, cwd, scratch, on_done) for b in batches))
        unreached = [j for b, s in zip(batches, said, strict=True) if s is not None for j in b]
        return FetchResult(any(s is None for s in said), unreached,
                           next((s for s in said if s), ""))

    async def _batch(self, jobs: list[Job], cwd: Path, scratch: Path,
                     on_done: Callable[[Job, str | None], None]) -> str | None:
        """One stream over a batch. Returns None once the agent answered, else what ssh said
        (the batch's jobs are then left to the caller)."""
        loop = asyncio.get_running_loop()
        stopped = threading.Event()  # set when we stop waiting: no callbacks after it

        def done(job: Job, said: str | None) -> None:
            def settle() -> None:
                self.in_flight.discard(job)
                if not stopped.is_set():
                    on_done(job, said)
            if not stopped.is_set():
                loop.call_soon_threadsafe(settle)

        def started(job: Job) -> None:
            loop.call_soon_threadsafe(self.in_flight.add, job)

        spawned = self._ready.pop() if self._ready else self._spawn()
        if isinstance(spawned, str):
            return spawned
        proc, errlog = spawned
        with errlog:
            assert proc.stdin is not None and proc.stdout is not None
            offsets = {job: _size(cwd / (job.rel + ".fdpart")) for job in jobs}
            requests = [request_line(j.rel, offsets[j], j.size - offsets[j]) for j in jobs]
            threading.Thread(target=_send_requests, args=(proc.stdin, requests),
                             daemon=True).start()
            left: list[Job] = []  # the jobs the stream never got to
            try:
                reached, why = await asyncio.to_thread(
                    self._receive, proc.stdout, jobs, offsets, cwd, started, done, left)
            finally:
                # What the thread queued before this ran on the loop already (call_soon_
                # threadsafe keeps order); anything later is dropped (we were cancelled).
                stopped.set()
                _kill_group(proc)
                code = await asyncio.to_thread(proc.wait)
                proc.stdout.close()
            errlog.seek(0, io.SEEK_END)
            errlog.seek(max(0, errlog.tell() - STDERR_KEEP))
            err = errlog.read().decode(errors="replace").strip()
        if not reached:
            return (f"ssh exited with {code}" if code >= 0 else
                    f"ssh was killed (signal {-code})") + (f": {err}" if err else "")
        if why is not None and err:
            why = f"{why}: {err.splitlines()[-1]}"
        for job in left:
            on_done(job, f"not fetched: {why or 'the stream ended'}")
        return None

    def _receive(self, out: IO[bytes], jobs: list[Job], offsets: dict[Job, int], cwd: Path,
                 started: Callable[[Job], None], done: Callable[[Job, str | None], None],
                 left: list[Job]) -> tuple[bool, str | None]:
        """Read the stream (in a thread). Returns (the agent answered, why it stopped early
        or None); the jobs it never got to are put in `left`."""
        r = io.BufferedReader(cast(io.RawIOBase, out), buffer_size=HEAD_BUFFER)
        if r.readline(len(MAGIC) + 1) != MAGIC:
            return False, None
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        todo = list(jobs)
        while todo:
            job = todo[0]
            i = len(jobs) - len(todo)
            started(job)
            offset = offsets[job]
            asked = job.size - offset
            try:
                n = _header(r.readline(MAX_HEADER + 1), i, asked)
            except StreamError as exc:
                left.extend(todo[1:])
                done(job, str(exc))
                return True, str(exc)
            if isinstance(n, str):
                todo.pop(0)
                done(job, n)  # the node refused this file, and said why
                continue
            part = cwd / (job.rel + ".fdpart")
            hashed = Hashed()
            got = 0
            try:
                fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644)
            except OSError as exc:
                left.extend(todo[1:])
                done(job, f"{type(exc).__name__}: {exc}")
                return True, f"cannot write {job.rel}.fdpart"
            try:
                if offset:
                    with open(fd, "rb", closefd=False) as existing:
                        hashed.finish(existing, offset)
                os.lseek(fd, offset, os.SEEK_SET)
                flushed = offset
                while got < n:
                    k = r.readinto1(view[:min(BLOCK, n - got)])
                    if not k:
                        break
                    hashed.h.update(view[:k])
                    _write_all(fd, view[:k])
                    got += k
                    hashed.upto = offset + got
                    if offset + got - flushed >= WRITEBACK:
                        start_writeback(fd, flushed, offset + got - flushed)
                        flushed = offset + got
                os.ftruncate(fd, offset + got)
            except OSError as exc:
                left.extend(todo[1:])
                done(job, f"{type(exc).__name__}: {exc}")
                return True, f"cannot write {job.rel}.fdpart"
            finally:
                os.close(fd)
            todo.pop(0)
            self.hashed[job] = hashed
            if got < n:
                left.extend(todo)
                done(job, f"the stream ended at {offset + got} of {job.size} bytes")
                return True, "the stream ended early"
            done(job, None if n == asked else
                 f"the node had only {offset + n} of {job.size} bytes")
        return True, None


def _header(line: bytes, i: int, asked: int) -> int | str:
    """The byte count a header announces, or the node's refusal (a str); StreamError when the
    header is not the one expected."""
    if not line:
        raise StreamError("the stream ended before this file")
    if len(line) > MAX_HEADER or not line.endswith(b"\n"):
        raise StreamError("a header line longer than the protocol allows")
    try:
        head = json.loads(line)
    except ValueError:
        raise StreamError("a header that is not JSON") from None
    if not isinstance(head, dict) or head.get("i") != i:
        raise StreamError(f"a header for another file than #{i}")
    n = head.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= asked:
        raise StreamError(f"a byte count of {n!r} where at most {asked} were asked")
    error = head.get("error")
    if error is not None:
        if n:
            raise StreamError("a refusal that also announces bytes")
        return f"the node refused it: {str(error)[:500]}"
    return n


def _send_requests(stdin: IO[bytes], lines: list[bytes]) -> None:
    """Write the requests (in a thread: the agent reads them while it sends, and a request
    list longer than a pipe would otherwise wait on our reading)."""
    try:
        for line in lines:
            _write_all(stdin.fileno(), line)
    except OSError:
        pass  # the stream ended; the reader says why
    finally:
        try:
            stdin.close()
        except OSError:
            pass


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        k = os.write(fd, view)
        view = view[k:]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _widen_pipe(fd: int) -> None:
    """The pipe from ssh holds PIPE_BYTES instead of Linux's 64 KiB: each read takes up to
    that much, not a 64 KiB handoff (a context switch each way) per 64 KiB. Measured, one
    stream of 1 GB into this reader: 4.6 s through a 64 KiB pipe, ~1.6 s through 1 MiB."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setpipe is None:
        return
    try:
        fcntl.fcntl(fd, setpipe, PIPE_BYTES)
    except OSError:
        pass  # over /proc/sys/fs/pipe-max-size for an unprivileged user: the default stays


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
