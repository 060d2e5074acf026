"""The fast data path of `fleetdeck pull`: OpenSSH's own `sftp` client (C), in batch mode.

asyncssh's SFTP client costs ~6 CPU-s per GB in Python, which made pull slower than `scp`;
OpenSSH's sftp moves the same bytes in C, with AES-GCM on the CPU's AES instructions. The files
are split across a few sftp processes (balanced by bytes; small files share a batch), each
running a batch of `-reget "REL" "REL.fdpart"` lines after a `cd` into RUN_DIR: `reget` resumes
from the local part's size, and the leading `-` keeps the batch going past a file that fails.

sftp echoes every batch line (`sftp> ...`) as it starts it, and its errors go to the same pipe
in order, so the echo of line N+1 says that file N is done and what sftp said in between is
about file N: the caller checks each file while the rest still downloads.

Host keys are checked strictly against the node's known_hosts, by name and by address, with
the options every OpenSSH client here takes (console/openssh.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from console.fleet import Node
from console.localproc import die_with_parent
from console.openssh import client_options

# Parallel sftp processes, each an SSH connection: over a long RTT one connection is held back
# by OpenSSH's 2 MiB channel window per round trip, so up to 4; but each also keeps ~4
# processes busy here and on the node, and on 2 cores 4 streams took ~6% more CPU-s and longer
# than 2 (benchmarks/pull.py's tree, 5 rounds: median 4.66 s vs 4.31 s), so no more than cores.
PROCS = min(4, max(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 2))
# Requests in flight per file: OpenSSH's default, written out (16, 64, 128, 256 measured alike
# on loopback; 64 x 255 KiB already exceeds the channel window). No -B: sftp >= 8.6 takes the
# server's read limit (255 KiB from OpenSSH's sftp-server), while -B 262144 got 255 KiB back
# and re-requested the missing 1 KiB of every block (sftp -vvv: "Short data block").
REQUESTS = 64
# Every cipher OpenSSH enables by default, GCM first: `-c` replaces the list, so a server
# without GCM still gets one it knows.
CIPHERS = ",".join(["aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                    "chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr"])
# sftp reads batch lines with fgets() into 2048 bytes: a longer line would be split in two.
MAX_LINE = 2047
# What a file costs beyond its bytes when balancing batches (a few round trips: stat, open,
# close), so one batch does not get all the small files.
FILE_COST = 64 * 1024
OUTPUT_LIMIT = 1 << 20
ECHO = "sftp> "


def find_sftp() -> str | None:
    return shutil.which("sftp")


def quote(text: str) -> str:
    """One sftp argument. Inside double quotes sftp treats * ? [ as literal characters (it
    escapes them for its glob itself: escaping them here too looks for a backslash), so only
    the backslash and the double quote need escaping."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _path(rel: str) -> str:
    # A path starting with '-' would be read as get's flags.
    return "./" + rel if rel.startswith("-") else rel


def _line(text: str) -> bytes | None:
    raw = os.fsencode(text) + b"\n"
    if b"\n" in raw[:-1] or b"\r" in raw or len(raw) > MAX_LINE:
        return None
    return raw


def batch_line(rel: str) -> bytes | None:
    """The batch line fetching RUN_DIR/rel into rel.fdpart (relative to the process's working
    directory), or None when sftp cannot be told that name (a newline, too long)."""
    return _line(f"-reget {quote(_path(rel))} {quote(_path(rel) + '.fdpart')}")


def cd_line(run_dir: str) -> bytes | None:
    # No leading '-': when RUN_DIR is not there, the batch stops.
    return _line(f"cd {quote(run_dir)}")


def sftp_command(sftp: str, node: Node, batch: Path) -> list[str]:
    host = node.host or ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address, which sftp would split at ':' otherwise
    cmd = [sftp, "-q", "-b", str(batch), "-o", "BatchMode=yes", *client_options(node)]
    return [*cmd, "-c", CIPHERS, "-R", str(REQUESTS), host]


@dataclass(eq=False)
class Job:
    rel: str
    size: int  # expected bytes, for balancing
    line: bytes


def plan(jobs: list[Job], procs: int) -> list[list[Job]]:
    """Longest first onto the lightest batch: byte-balanced batches, small files together."""
    batches: list[list[Job]] = [[] for _ in range(max(1, min(procs, len(jobs))))]
    loads = [0] * len(batches)
    for job in sorted(jobs, key=lambda j: -j.size):
        i = loads.index(min(loads))
        batches[i].append(job)
        loads[i] += job.size + FILE_COST
    return [b for b in batches if b]


@dataclass
class FetchResult:
    connected: bool  # at least one sftp got as far as its first batch line
    unreached: list[Job]  # the jobs of processes that never did (on_done not called)
    said: str  # what such a process said (host key, authentication, connection refused)


class SftpFetcher:
    """Runs the sftp processes for one round of files; `in_flight` is what they are on now."""

    data_path = "openssh"
    hashes_inline = False  # the puller hashes the parts while sftp writes them

    def __init__(self, sftp: str, node: Node, run_dir: str, procs: int | None = None) -> None:
        self.sftp = sftp
        self.node = node
        self.run_dir = run_dir
        self.procs = procs or PROCS  # read here: a patched constant counts
        self.in_flight: set[Job] = set()

    def usable(self) -> bool:
        """Whether sftp can be told where RUN_DIR is (its batch lines are short)."""
        return cd_line(self.run_dir) is not None

    @staticmethod
    def can_name(rel: str) -> bool:
        return batch_line(rel) is not None

    async def fetch(self, jobs: list[Job], cwd: Path, scratch: Path,
                    on_done: Callable[[Job, str | None], None]) -> FetchResult:
        """Fetch the jobs into cwd; on_done(job, what sftp said or None) once per job, as soon
        as sftp has moved past it or stopped, except for the jobs of a process that never
        reached the node (returned instead). Cancelling kills the processes."""
        head = cd_line(self.run_dir)
        assert head is not None, "callers check cd_line first"
        if not jobs:
            return FetchResult(True, [], "")
        scratch.mkdir(parents=True, exist_ok=True)
        batches = plan(jobs, self.procs)
        said = await asyncio.gather(*(self._batch(b, head, cwd, scratch, on_done)
                                      for b in batches))
        unreached = [j for b, s in zip(batches, said, strict=True) if s is not None for j in b]
        return FetchResult(any(s is None for s in said), unreached,
                           next((s for s in said if s), ""))

    async def _batch(self, jobs: list[Job], head: bytes, cwd: Path, scratch: Path,
                     on_done: Callable[[Job, str | None], None]) -> str | None:
        """One sftp process over a batch. Returns None once it has reached the node, else
        what it said (its jobs are then left to the caller)."""
        fd, name = tempfile.mkstemp(prefix="sftp-batch-", dir=scratch)
        with os.fdopen(fd, "wb") as f:
            f.write(head + b"".join(j.line for j in jobs))
        current = -1  # the batch line sftp is on: 0 is the cd, job i is line i + 1
        said: list[str] = []
        proc: asyncio.subprocess.Process | None = None
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *sftp_command(self.sftp, self.node, Path(name)), cwd=cwd,
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT, limit=OUTPUT_LIMIT,
                    # Its own process group, so a cancel kills ssh beneath it too; and it
                    # dies with us (kill -9 of the pull included): no copier writes on into
                    # a part that a new pull is resuming. Its ssh, left without sftp, exits on
                    # the closed pipe.
                    start_new_session=True, preexec_fn=die_with_parent())
            except OSError as exc:
                return self._stopped(jobs, current, 127, [f"cannot run {self.sftp}: {exc}"],
                                     on_done)
            assert proc.stdout is not None
            while raw := await proc.stdout.readline():
                text = raw.decode(errors="replace").rstrip("\r\n")
                if not text.startswith(ECHO):
                    if text:
                        said.append(text)
                    continue
                if current > len(jobs):
                    continue  # an echo past the batch's last line: not one of ours
                if current >= 1:
                    self.in_flight.discard(jobs[current - 1])
                    on_done(jobs[current - 1], "; ".join(said) or None)
                current += 1
                said = []
                if 1 <= current <= len(jobs):
                    self.in_flight.add(jobs[current - 1])
            code = await proc.wait()
        finally:
            if proc is not None and proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await proc.wait()
            os.unlink(name)
            self.in_flight.difference_update(jobs)
        return self._stopped(jobs, current, code, said, on_done)

    @staticmethod
    def _stopped(jobs: list[Job], current: int, code: int, said: list[str],
                 on_done: Callable[[Job, str | None], None]) -> str | None:
        """The process has ended: settle the file it was on and those it never got to."""
        last = "; ".join(said)
        why = f"sftp was killed (signal {-code})" if code < 0 else f"sftp exited with {code}"
        why += f": {last}" if last else ""
        if current < 0:
            return why
        for i, job in enumerate(jobs):
            if i == current - 1:
                on_done(job, (last or None) if code == 0 else why)
            elif i >= current:
                on_done(job, f"not fetched: {why}")
        return None
