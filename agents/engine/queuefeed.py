"""A campaign node's side of the engine: the queue client. It opens the node's QueueWorker
on the campaign's prefix (the store probed, the pin agreed, chunks held before a restart taken
up), feeds chunk after chunk of lines to the engine's requests, and lets commits land at the
end. The queue itself (leases, commits, backups) is agents/queue."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from agents.engine.offsets import StaleOffsets
from agents.engine.uploader import make_s3_client
from agents.queue import records as queue_records
from agents.queue import s3ops
from agents.queue.board import Board, Me
from agents.queue.layout import Layout
from agents.queue.worker import QueueWorker, run_id_of

if TYPE_CHECKING:
    from agents.engine.run import Engine

log = logging.getLogger("fleetdeck.engine")

# A feed yields to the loop this often: each new request may open a connection (~0.5 ms of
# CPU), and 256 at a time held the loop for ~200 ms at 2,000 in flight.
FEED_YIELD = 16


class QueueFeed:
    """The engine's queue client: its parts are the engine's (store, dispatcher, offsets)."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine

    def open(self) -> QueueWorker:
        """A campaign node: the store probed for conditional writes, the campaign's pin agreed
        or put, the prompts' offset index loaded, chunks held before a restart taken up."""
        e = self.e
        q, s3 = e.spec.queue, e.spec.s3
        assert q is not None and s3 is not None and e.uploader is not None
        client = make_s3_client(s3)
        where = f"the S3 store at {s3.endpoint_url or 'AWS'} (bucket {s3.bucket!r})"
        s3ops.probe(client, s3.bucket, Layout(s3.prefix), where)
        run_id = run_id_of(e.run_dir)
        board = Board(client, s3.bucket, s3.prefix, Me(q.node, run_id), q.lease_s, q.skew)
        e.uploader.key_prefix = board.layout.batches(q.node, run_id)
        e.uploader.watch_journals(f"{q.node}/{run_id}", [e.journal.path])
        pin = queue_records.CampaignPin(
            campaign=e.spec.run.campaign or e.spec.run.name,
            prompts_sha256=e.pin.prompts_sha256, prompts_lines=e.pin.prompts_lines,
            chunk_size=q.chunk_size, model=e.spec.model_name, sampling=e.gen.sampling,
            chat_template_kwargs=e.gen.chat_template_kwargs, created_at=time.time(),
            created_by=q.node)
        w = QueueWorker.open(board, pin, e.run_dir, e.store.done, e.journal.state,
                             e._capacity, q.poll, q.backup_after)
        w.close_open = self.close_for_commit
        w.uploaded = self.uploaded
        w.abandon = self.abandon
        w.next_batch = lambda: e.store.next_number
        return w

    async def close_for_commit(self) -> int:
        """A chunk is complete: the open batch closed (its lines may be there), so every line
        of the chunk is in a closed batch; the batch number after the last closed one."""
        e = self.e
        async with e._store_lock:
            closed = await asyncio.to_thread(e.store.close_open_batch)
            e._closed([closed] if closed else [])
            return e.store.next_number

    async def uploaded(self, names: list[str]) -> dict[str, Any]:
        """Wait until each named batch is confirmed in S3; their upload records."""
        e = self.e
        up = e.uploader
        assert up is not None
        while True:
            if all(n in up.uploaded for n in names):
                return {n: up.uploaded[n] for n in names}
            await up.wait_upload()

    def abandon(self, indices: list[int]) -> None:
        """Another node committed the chunk: its requests still out are aborted."""
        e = self.e
        for i in indices:
            task = e._req_tasks.get(i)
            if task is not None:
                task.cancel()

    async def feed(self) -> None:
        """A campaign node: chunk after chunk from the queue, each one's lines read by their
        offsets; over once every chunk of the campaign is committed, or on stop."""
        e = self.e
        q = e.queue
        assert q is not None
        while not e.stopping:
            work = await q.next_chunk(lambda: e.stopping)
            if work is None:
                break
            todo, work.unsent = work.unsent, []
            pos = 0
            try:
                for index, raw in e.offsets.read(e.spec.prompts_path, todo,
                                                 e.gen.max_prompt_bytes):
                    if e.stopping:
                        return
                    if work.lost or index not in work.todo or index in e._inflight:
                        pos += 1
                        continue
                    server = await e.dispatcher.acquire()
                    if server is None:
                        return
                    pos += 1
                    if work.lost or index not in work.todo:
                        await e.dispatcher.release(server)
                        continue
                    e._dispatch(index, raw, server, work.chunk.attempt)
                    if pos % FEED_YIELD == 0:
                        await asyncio.sleep(0)
            except StaleOffsets as exc:
                await e._offsets_stale(exc)
            finally:
                if pos < len(todo) and not work.lost:
                    work.unsent = todo[pos:] + work.unsent
        # Stopping, or the campaign is done: what is in flight ends, lines on disk.
        while e._live and not e.stopping:
            e._idle.clear()
            await e._idle.wait()
        await e._join_writer()

    async def finish(self) -> None:
        """A campaign node at its end: the commits under way land (unless S3 stays away
        past the drain), and on a stop the leases of unfinished chunks are released, so
        another node takes them at once rather than after their term."""
        e = self.e
        q = e.queue
        assert q is not None
        try:
            await asyncio.wait_for(q.drain(), e.gen.drain_timeout_s)
        except TimeoutError:
            e.message = e.message or (f"commits not yet in S3 ({q.figures.s3_error}); a "
                                      "resume commits them")
            log.warning("queue: %s", e.message)
        if e.stopping:
            await asyncio.to_thread(q.release_all)
