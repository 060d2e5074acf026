"""The queue on a node: which chunks this engine holds, what of them is still to do, their
leases renewed, and each one committed once every index of it is done or failed.

The engine asks `next_chunk()` for work and sends the lines it yields; it tells `resolved()`
of every line written and every failure journaled. A chunk whose last index resolves is
committed: the open batch is closed, the batches holding its lines are confirmed in S3, and
the commit record (each batch's key, SHA-256 and indices; which indices failed) is created
where none is. The first commit wins; a refused one is said, and its lines do not count.

The campaign's figures (tally.py) come from the commit objects: each listing the finder makes
is counted, every commit read once (a little of them each look, all of them before the node
calls the campaign finished), this node's own commits as it makes them.

Local state, for a restart: `RUN_DIR/queue/member.json` (this run's id, made once) and
`RUN_DIR/queue/chunks.jsonl` (each chunk taken, with the batch number its lines start at, and
each one's end: its commit's outcome, or dropped when another node committed it, with the
lines this node had written of it that no commit names).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from agents.engine.doneset import DoneSet
from agents.engine.durable import DurableAppend
from agents.engine.journal import JournalState
from agents.queue import records as rec
from agents.queue.board import Board, GenState, Held
from agents.queue.chunks import Chunk
from agents.queue.ranges import expand, to_ranges
from agents.queue.tally import Tally
from agents.queue.union import commit_problem
from agents.rundir.atomic import atomic_write, cut_torn_tail, make_dirs
from agents.rundir.batchnames import batch_name
from agents.rundir.crashpoint import crash_point

log = logging.getLogger("fleetdeck.queue")

FOLDER = "queue"
# What one look for work spends reading commit objects it has not read yet (a node that
# joins a campaign of thousands of commits catches up over its looks, not before its claim).
COUNT_BUDGET_S = 0.5


class ChunkEvent(msgspec.Struct, omit_defaults=True):
    op: Literal["take", "commit", "drop"]  # drop: another node's commit is the chunk's
    generation: int
    chunk: int
    at: float
    backup: bool = False
    first_batch: int = 0  # take: the batch number this chunk's lines start at
    won: bool = False  # commit: this node's commit is the chunk's
    by: str | None = None  # commit, drop: whose is, when not ours
    lines: int = 0  # a commit refused, a drop: this node's lines of it that no commit names


class _LineKey(msgspec.Struct):
    index: int
    attempt: int = 1
    finish_reason: str | None = None


_event_decoder = msgspec.json.Decoder(ChunkEvent)
_line_decoder = msgspec.json.Decoder(_LineKey)
_encode = msgspec.json.Encoder().encode


@dataclass
class Work:
    """A chunk this node holds: what of it is to send and to resolve."""

    held: Held
    first_batch: int
    todo: set[int]  # not yet done or failed here at this generation's attempt
    unsent: list[int]  # of todo, not yet handed to the engine
    committing: bool = False
    lost: bool = False  # another node committed it: drop what is left

    @property
    def chunk(self) -> Chunk:
        return self.held.chunk


@dataclass
class QueueFigures:
    """What progress.json shows of the queue."""

    generation: int = 0
    chunks: int = 0
    committed: int = 0
    committed_here: int = 0
    lost: int = 0  # commits refused: another node was first
    lost_lines: int = 0  # lines written here that no commit names (refused, dropped chunks)
    held: list[str] = field(default_factory=list)
    backups: int = 0
    taken_over: int = 0
    s3_error: str | None = None


def member_file(run_dir: Path) -> Path:
    return run_dir / FOLDER / "member.json"


def run_id_of(run_dir: Path) -> str:
    """This run directory's id in the campaign, made once and kept (a restart is the same
    run; a new run dir, or a run resumed from S3 on a new disk, is a new one)."""
    path = member_file(run_dir)
    try:
        return str(msgspec.json.decode(path.read_bytes())["run_id"])
    except (FileNotFoundError, KeyError, msgspec.DecodeError, TypeError):
        pass
    make_dirs(path.parent)
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
    atomic_write(path, _encode({"run_id": run_id}))
    return run_id


class QueueWorker:
    def __init__(self, board: Board, pin: rec.CampaignPin, run_dir: Path, done: DoneSet,
                 journal: JournalState, capacity: Callable[[], int], poll_s: float,
                 backup_after: float) -> None:
        self.board = board
        self.pin = pin
        self.run_dir = run_dir
        self.done = done
        self.journal = journal
        self.capacity = capacity
        self.poll_s = poll_s
        self.backup_after = backup_after
        self.work: dict[tuple[int, int], Work] = {}
        self.by_index: dict[int, Work] = {}
        self.figures = QueueFigures()
        self.tally = Tally(pin.prompts_lines, board.me.node)
        self._listed: dict[int, set[int]] = {}  # generation -> chunks the last listing had
        self._unreadable: set[tuple[int, int]] = set()  # commits that do not hold together
        self.max_tokens: dict[int, int | None] = {0: None}  # a generation's own max_tokens
        self.finished = False  # every chunk of every generation committed
        self._changed = asyncio.Event()
        self._log: DurableAppend | None = None
        self._commits: set[asyncio.Task[None]] = set()
        # Set by the engine: close the open batch (under its writer's lock), wait until the
        # named batches are in S3 and return their records, drop indices another node won.
        self.close_open: Callable[[], Awaitable[int]] | None = None
        self.uploaded: Callable[[list[str]], Awaitable[dict[str, Any]]] | None = None
        self.abandon: Callable[[list[int]], None] | None = None
        self.next_batch: Callable[[], int] = lambda: 0

    # -- start -------------------------------------------------------------------------------

    @classmethod
    def open(cls, board: Board, pin: rec.CampaignPin, run_dir: Path, done: DoneSet,
             journal: JournalState, capacity: Callable[[], int], poll_s: float,
             backup_after: float) -> QueueWorker:
        """Blocking: the campaign's pin agreed, this node a member, its chunks from before a
        restart taken up again where they are still its own."""
        w = cls(board, pin, run_dir, done, journal, capacity, poll_s, backup_after)
        w.pin = board.pin(pin)
        board.join(socket.gethostname())
        path = run_dir / FOLDER / "chunks.jsonl"
        make_dirs(path.parent)
        cut_torn_tail(path)
        taken: dict[tuple[int, int], ChunkEvent] = {}
        if path.exists():
            for lineno, raw in enumerate(path.read_bytes().splitlines(), 1):
                if not raw.strip():
                    continue
                try:
                    ev = _event_decoder.decode(raw)
                except msgspec.DecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: unreadable: {exc}") from None
                key = (ev.generation, ev.chunk)
                if ev.op == "take":
                    taken[key] = ev
                    continue
                taken.pop(key, None)
                w._ended(ev)
        w._log = DurableAppend(path, "queue")
        gens = board.generations(w.pin)
        for (g, n), ev in sorted(taken.items()):
            if g not in gens:
                continue
            chunk = board.chunks(g)[n]
            held = board.resume(chunk, ev.backup, ev.at)
            if held is None:
                w._gone(chunk)
                continue
            w._hold(held, ev.first_batch)
        return w

    def _ended(self, ev: ChunkEvent) -> None:
        """A chunk's end, journaled (now, or read back at a restart), in the figures."""
        f = self.figures
        if ev.op == "commit":
            f.committed_here += ev.won
            f.lost += not ev.won
        f.lost_lines += ev.lines

    def _end(self, ev: ChunkEvent) -> None:
        assert self._log is not None
        self._log.append(_encode(ev) + b"\n")
        self._ended(ev)

    def _lines_here(self, chunk: Chunk) -> int:
        return sum(1 for i in expand(chunk.indices) if self.done.has(i, chunk.attempt))

    def _gone(self, chunk: Chunk) -> None:
        """(Blocking, at a restart.) A chunk taken before it that is no longer this node's:
        committed by this run (the commit landed, its outcome not journaled), or by another
        node, or its lease gone to another node; its end journaled."""
        try:
            there = self.board.read_commit(chunk.generation, chunk.number)
        except ValueError as exc:  # not a commit record: not this run's either
            log.warning("chunk %s: %s", chunk.name, exc)
            there = None
        me = self.board.me
        if there is not None and (there.node, there.run_id) == (me.node, me.run_id):
            log.info("chunk %s: committed by this run before the restart", chunk.name)
            self._end(ChunkEvent(op="commit", generation=chunk.generation, chunk=chunk.number,
                                 at=time.time(), won=True))
            return
        lines = self._lines_here(chunk)
        log.info("chunk %s: no longer this node's (%s); %d lines of it here are in no commit",
                 chunk.name, f"committed by {there.node}" if there else "taken over", lines)
        self._end(ChunkEvent(op="drop", generation=chunk.generation, chunk=chunk.number,
                             at=time.time(), by=there.node if there else None, lines=lines))

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- what the engine asks ----------------------------------------------------------------

    def wants(self, index: int) -> bool:
        return index in self.by_index

    def attempt(self, index: int) -> int:
        work = self.by_index.get(index)
        return work.chunk.attempt if work is not None else 1

    def max_tokens_for(self, index: int) -> int | None:
        work = self.by_index.get(index)
        return self.max_tokens.get(work.chunk.generation) if work is not None else None

    def resolved(self, index: int, attempt: int) -> None:
        """A line of `index` at `attempt` is durable, or its failure is journaled."""
        work = self.by_index.get(index)
        if work is None or attempt != work.chunk.attempt:
            return
        work.todo.discard(index)
        del self.by_index[index]
        if not work.todo:
            self._complete(work)

    def limit(self) -> int:
        """Chunks held at once: enough to keep every slot busy, and one ahead."""
        return -(-max(1, self.capacity()) // self.pin.chunk_size) + 1

    async def next_chunk(self, stopping: Callable[[], bool]) -> Work | None:
        """A held chunk with lines to send, claiming, taking over or backing up one as the
        queue allows; None once every chunk of the campaign is committed (or on stop)."""
        while not stopping():
            self._sweep()
            for work in self.work.values():
                if work.unsent and not work.lost:
                    return work
            self._changed.clear()
            unfinished = sum(1 for w in self.work.values() if not w.lost)
            if unfinished < self.limit():
                try:
                    got = await asyncio.to_thread(self._find, unfinished == 0)
                    self.figures.s3_error = None
                except Exception as exc:  # S3 away: keep what is held
                    self.figures.s3_error = f"{type(exc).__name__}: {exc}"[:300]
                    log.warning("queue: cannot look for work: %s", self.figures.s3_error)
                    got = None
                if isinstance(got, tuple):
                    self._hold(*got)
                    continue
                if got == "finished" and not self.work:
                    self.finished = True
                    return None
            try:
                await asyncio.wait_for(self._changed.wait(), self.poll_s)
            except TimeoutError:
                pass
        return None

    # -- finding work (blocking) -------------------------------------------------------------

    def _find(self, idle: bool) -> tuple[Held, int] | Literal["finished"] | None:
        """Claim a free chunk; else take over an expired lease; else, idle, back up a slow
        running chunk. "finished" when every chunk of every generation is committed."""
        board = self.board
        states: list[GenState] = []
        for g in board.generations(self.pin):
            if g not in self.max_tokens:
                gen = board.generation(g)
                self.max_tokens[g] = gen.max_tokens if gen is not None else None
            states.append(board.state(g))
        self._figures(states)
        finished = not any(st.open() for st in states)
        if finished:
            # Every commit read first, so the figures the node ends on are the campaign's.
            self.count_commits(None)
            return "finished"
        try:
            self.count_commits(COUNT_BUDGET_S)
        except Exception as exc:  # a read that failed does not hold up a claim
            log.warning("queue: cannot read the commits: %s", exc)
        for st in states:
            free = [c for c in st.free() if (st.generation, c.number) not in self.work]
            # Nodes looking at once spread over the first few free chunks, not all on one.
            for chunk in random.sample(free[:8], len(free[:8])) + free[8:]:
                held = board.claim(chunk)
                if held is not None:
                    return self._taken(held)
        for st in states:
            for n in sorted(st.leases):
                if n in st.committed or (st.generation, n) in self.work:
                    continue
                chunk = board.chunks(st.generation)[n]
                if board.expired(st, n) or self._released(st, n):
                    held = board.take_over(chunk, st)
                    if held is not None:
                        self.figures.taken_over += 1
                        return self._taken(held)
        if idle:
            return self._backup(states)
        return None

    def _released(self, st: GenState, n: int) -> bool:
        got = self.board.read_lease(self.board.chunks(st.generation)[n])
        return got is not None and got[0].lease_s == 0.0 and got[1] == st.leases[n].etag

    def _backup(self, states: list[GenState]) -> tuple[Held, int] | None:
        """MapReduce's backup task: a running chunk older than `backup_after` times the
        median chunk time gets one copy, on an idle node."""
        for st in states:
            running = [n for n in st.leases if n not in st.committed and n not in st.backups
                       and (st.generation, n) not in self.work]
            if not running:
                continue
            took = self.board.durations(st.generation)
            if len(took) < 3:
                continue
            limit = self.backup_after * statistics.median(took)
            for n in sorted(running, key=lambda n: st.leases[n].last_modified):
                got = self.board.running_s(st, n)
                if got is None or got[0].node == self.board.me.node:
                    continue
                lease, age = got
                if age < limit:
                    continue
                held = self.board.backup(self.board.chunks(st.generation)[n], lease.node)
                if held is not None:
                    log.info("backing up chunk %s of %s: running %.0f s, median %.0f s",
                             held.chunk.name, lease.node, age, statistics.median(took))
                    self.figures.backups += 1
                    return self._taken(held)
        return None

    def _figures(self, states: list[GenState]) -> None:
        f = self.figures
        f.generation = max(st.generation for st in states)
        f.chunks = sum(len(st.chunks) for st in states)
        f.committed = sum(len(st.committed) for st in states)
        self._listed = {st.generation: set(st.committed) for st in states}

    def count_commits(self, budget_s: float | None) -> int:
        """(Blocking.) The commits the last listing had and the tally has not, read (each
        once) and counted, lowest generation first, for about `budget_s` (None: all of
        them); how many were read. One that does not hold together with its chunk is said
        once and counted nowhere (verify names it too)."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        read = 0
        for g, numbers in sorted(self._listed.items()):
            chunks = self.board.chunks(g)
            for n in sorted(numbers):
                if self.tally.has(g, n) or (g, n) in self._unreadable:
                    continue
                if deadline is not None and read and time.monotonic() > deadline:
                    return read
                read += 1
                problem: str | None = None
                try:
                    c = self.board.read_commit(g, n)
                except ValueError as exc:
                    c, problem = None, str(exc)
                if c is not None:
                    problem = (f"chunk {n} is not one of generation {g}'s {len(chunks)}"
                               if n >= len(chunks) else
                               commit_problem(c, chunks[n].indices, g, n,
                                              self.pin.prompts_lines))
                if problem is not None:
                    log.warning("queue: the commit of chunk %d of generation %d is not counted: "
                                "%s", n, g, problem)
                    self._unreadable.add((g, n))
                if c is None or problem is not None:
                    continue
                self.board.remember(c)
                self.tally.add(c)
        return read

    def _taken(self, held: Held) -> tuple[Held, int]:
        """(In the finder's thread.) A chunk just taken, journaled with the batch its lines
        can start at: any batch from now on (the number only grows)."""
        crash_point("queue_claim")
        first_batch = self.next_batch()
        assert self._log is not None
        chunk = held.chunk
        self._log.append(_encode(ChunkEvent(op="take", generation=chunk.generation,
                                            chunk=chunk.number, at=held.claimed_at,
                                            backup=held.backup, first_batch=first_batch))
                         + b"\n")
        return held, first_batch

    def _hold(self, held: Held, first_batch: int) -> Work:
        """(On the loop.) A taken chunk becomes work: what of it is not done here yet."""
        chunk = held.chunk
        a = chunk.attempt
        todo = [i for i in expand(chunk.indices) if not self.done.has(i, a)
                and not self._failed_at(i, a) and i not in self.by_index]
        work = Work(held, first_batch, set(todo), todo)
        self.work[(chunk.generation, chunk.number)] = work
        for i in todo:
            self.by_index[i] = work
        self.figures.held = [w.chunk.name for w in self.work.values()]
        log.info("holding chunk %s (%s, epoch %d): %d of %d indices to do",
                 chunk.name, "backup" if held.backup else "lease", held.epoch, len(todo),
                 chunk.size)
        return work

    def _sweep(self) -> None:
        """Chunks with nothing left to resolve (all done before a restart) go to commit."""
        for work in list(self.work.values()):
            if not work.todo and not work.committing and not work.lost:
                self._complete(work)

    def _failed_at(self, index: int, attempt: int) -> bool:
        last = self.journal.last.get(index)
        return last is not None and last[0] == "failed" and last[1] >= attempt

    def sent(self, work: Work, count_: int) -> None:
        """The engine took this many of the chunk's unsent indices."""
        del work.unsent[:count_]

    # -- renewing ----------------------------------------------------------------------------

    async def keep(self) -> None:
        """Forever: every held lease renewed each lease_s / 4, and each held chunk looked up
        for a commit by another node (a backup or a taker that was first)."""
        interval = self.board.lease_s / 4
        while True:
            await asyncio.sleep(interval)
            self._sweep()
            try:  # the commits the finder's last listing had and it had no time to read
                await asyncio.to_thread(self.count_commits, COUNT_BUDGET_S)
            except Exception as exc:  # S3 away: the next look reads them
                log.warning("queue: cannot read the commits: %s", exc)
            for work in list(self.work.values()):
                if work.committing or work.lost:
                    continue
                try:
                    if await asyncio.to_thread(self.board.committed, work.chunk):
                        self._lose(work, "committed by another node")
                        continue
                    if work.held.etag is not None and not work.held.backup and \
                            not await asyncio.to_thread(self.board.renew, work.held):
                        # Taken over: keep going (its first commit still counts), but say so.
                        log.warning("chunk %s: the lease was taken over; going on, the first "
                                    "commit counts", work.chunk.name)
                        work.held.etag = None
                    self.figures.s3_error = None
                except Exception as exc:  # cut off from S3: keep generating
                    self.figures.s3_error = f"{type(exc).__name__}: {exc}"[:300]
                    log.warning("queue: cannot renew chunk %s: %s", work.chunk.name,
                                self.figures.s3_error)
                crash_point("queue_renew")

    def _lose(self, work: Work, why: str) -> None:
        work.lost = True
        left = sorted(work.todo)
        for i in left:
            self.by_index.pop(i, None)
        work.todo.clear()
        work.unsent.clear()
        chunk = work.chunk
        lines = self._lines_here(chunk)
        log.info("chunk %s: %s; dropping its %d indices still to do (%d lines of it here are "
                 "in no commit)", chunk.name, why, len(left), lines)
        if self.abandon is not None and left:
            self.abandon(left)
        self._end(ChunkEvent(op="drop", generation=chunk.generation, chunk=chunk.number,
                             at=time.time(), lines=lines))
        self._forget(work)

    def _forget(self, work: Work) -> None:
        self.work.pop((work.chunk.generation, work.chunk.number), None)
        self.figures.held = [w.chunk.name for w in self.work.values()]
        self._changed.set()

    # -- committing --------------------------------------------------------------------------

    def _complete(self, work: Work) -> None:
        if work.committing:
            return
        work.committing = True
        task = asyncio.get_running_loop().create_task(self._commit(work))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)

    async def _commit(self, work: Work) -> None:
        chunk = work.chunk
        delay = 1.0
        while True:
            try:
                await self._commit_once(work)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # S3 away: try again, the lines are safe
                self.figures.s3_error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("chunk %s: commit failed, retrying in %.0f s: %s", chunk.name, delay,
                            self.figures.s3_error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _commit_once(self, work: Work) -> None:
        chunk = work.chunk
        assert self.close_open is not None and self.uploaded is not None
        end = await self.close_open()  # every line of the chunk is in a closed batch now
        parts = await asyncio.to_thread(self._scan, work, end)
        records = await self.uploaded(list(parts))
        done: list[int] = []
        truncated: list[int] = []
        batches = []
        for name, (indices, cut) in sorted(parts.items()):
            r = records[name]
            batches.append(rec.BatchPart(key=r.key, sha256=r.sha256, size=r.size,
                                         indices=to_ranges(indices)))
            done += indices
            truncated += cut
        done_set = set(done)
        failed = [i for i in expand(chunk.indices) if i not in done_set]
        unresolved = [i for i in failed if not self._failed_at(i, chunk.attempt)]
        if unresolved:
            raise RuntimeError(f"{len(unresolved)} indices of chunk {chunk.name} are neither in a "
                               f"batch nor failed (first {unresolved[0]})")
        commit = rec.Commit(
            generation=chunk.generation, chunk=chunk.number, node=self.board.me.node,
            run_id=self.board.me.run_id, epoch=work.held.epoch, started_at=work.held.claimed_at,
            committed_at=time.time(), done=to_ranges(done), failed=to_ranges(failed),
            truncated=to_ranges(truncated), batches=batches, attempt=chunk.attempt,
            bad_input=to_ranges(i for i in failed if self.journal.last[i][2] == "bad_input"))
        won, there = await asyncio.to_thread(self.board.commit, commit)
        crash_point("queue_commit")
        self._end(ChunkEvent(op="commit", generation=chunk.generation, chunk=chunk.number,
                             at=time.time(), won=won,
                             by=None if won else (there.node if there else "?"),
                             lines=0 if won else len(done)))
        if won:
            self.figures.committed += 1
            self.board.remember(commit)
            self.tally.add(commit)
            log.info("committed chunk %s: %d done (%d truncated), %d failed, in %d batches",
                     chunk.name, len(done), len(truncated), len(failed), len(batches))
        else:
            who = f"{there.node} (run {there.run_id}, epoch {there.epoch})" if there else "?"
            log.warning("chunk %s: commit refused, %s committed it first; this node's %d lines "
                        "of it are not counted", chunk.name, who, len(done))
        self._forget(work)

    def _scan(self, work: Work, end: int) -> dict[str, tuple[list[int], list[int]]]:
        """The closed batches from the chunk's first on: which hold its lines (this
        generation's attempt), and which of those were cut at max_tokens."""
        chunk = work.chunk
        wanted = set(expand(chunk.indices))
        out: dict[str, tuple[list[int], list[int]]] = {}
        folder = self.run_dir / "completions"
        for n in range(work.first_batch, end):
            name = batch_name(n)
            try:
                with open(folder / name, "rb") as f:
                    for raw in f:
                        key = _line_decoder.decode(raw)
                        if key.index in wanted and key.attempt == chunk.attempt:
                            got = out.setdefault(name, ([], []))
                            got[0].append(key.index)
                            if key.finish_reason == "length":
                                got[1].append(key.index)
            except FileNotFoundError:
                continue
        return out

    async def drain(self) -> None:
        """At the end: wait for the commits under way."""
        if self._commits:
            await asyncio.gather(*self._commits, return_exceptions=True)

    def release_all(self) -> None:
        """A clean stop (blocking): leases not finished marked released for the next node."""
        for work in list(self.work.values()):
            if not work.committing and not work.lost:
                try:
                    self.board.release(work.held)
                except Exception as exc:  # it expires anyway
                    log.warning("chunk %s: cannot release the lease: %s", work.chunk.name, exc)

    def summary(self) -> dict[str, Any]:
        f = self.figures
        t = self.tally
        return {"generation": f.generation, "chunks": f.chunks, "committed": f.committed,
                "committed_here": f.committed_here, "lost": f.lost, "held": f.held,
                "backups": f.backups, "taken_over": f.taken_over, "s3_error": f.s3_error,
                "to_do_here": sum(len(w.todo) for w in self.work.values()),
                "prompts_lines": self.pin.prompts_lines, "chunk_size": self.pin.chunk_size,
                "commits_counted": t.commits, "lines_done": t.campaign.done,
                "lines_failed": t.campaign.failed, "lines_truncated": t.campaign.truncated,
                "done_here": t.here.done, "failed_here": t.here.failed,
                "truncated_here": t.here.truncated, "lost_lines": f.lost_lines}


