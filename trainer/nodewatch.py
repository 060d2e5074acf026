"""Heartbeats between the nodes of a training run, through the rendezvous store on node 0.

The first process of every node counts a beat in the store each `interval`; a node whose
count stands still for `[train] node_timeout_s`, or a store that stops answering that long
(node 0, which hosts it, is gone), is lost: the job stops with "rank R of N (host: run dir)
lost: why" in progress.json. A collective that fails first (a peer's socket closed) asks
`explain` which node it was. A node that finished marks itself done and is never lost.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from trainer.distributed import Dist

log = logging.getLogger("fleetdeck.train")

# The exit status of a process that stopped because another node was lost.
LOST_EXIT = 3


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """"HOST:PORT" (or "[v6]:PORT") -> (host, port); ValueError naming the value."""
    host, sep, port = endpoint.rpartition(":")
    host = host.strip("[]")
    number = port.isascii() and port.isdigit()  # "²".isdigit() holds; int("²") raises
    if not sep or not host or not number or not 1 <= int(port) <= 65535:
        raise ValueError(f"{endpoint!r} is not HOST:PORT")
    return host, int(port)


def short_error(exc: BaseException) -> str:
    """A collective's error in a few words: gloo's "[.../pair.cc:537] Read error [IP]:PORT:
    Connection reset by peer. This is typically caused by..." -> "Read error [IP]:PORT:
    Connection reset by peer"."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically")[0][:200]


class NodeWatch:
    """Two threads: `beat` talks to the store (a store whose host is stopped or cut off can
    hold one of its calls forever: a TCPStore client's add() has no deadline), `judge` only
    reads the times the beat last got through, so it always decides in time."""

    def __init__(self, d: Dist, endpoint: str, run_id: str, timeout_s: float,
                 on_lost: Callable[[str], None]) -> None:
        self.d = d
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.interval = min(1.0, max(0.2, timeout_s / 10))
        # After a failed collective, a node this long without a beat is the one that went.
        self.stale_s = 2.5 * self.interval
        self.on_lost = on_lost
        host, port = split_endpoint(endpoint)
        store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=max(1.0, 2 * self.interval)))
        self.store = dist.PrefixStore(f"fleetdeck-nodewatch/{run_id}/", store)
        self.others = [r for r in range(d.nodes) if r != d.node_rank]
        now = time.monotonic()
        self._count: dict[int, int] = {r: -1 for r in self.others}
        self._changed: dict[int, float] = {r: now for r in self.others}
        self._done: set[int] = set()
        self._store_ok = now
        self._store_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._mark_done = False
        self._reporting = False  # the main thread reports the failure itself
        self.verdict: str | None = None
        self._beat_thread = threading.Thread(target=self._beat_loop, name="nodewatch-beat",
                                             daemon=True)
        self._judge_thread = threading.Thread(target=self._judge_loop,
                                              name="nodewatch-judge", daemon=True)

    def start(self) -> NodeWatch:
        self._beat_thread.start()
        self._judge_thread.start()
        return self

    def stop(self, done: bool) -> None:
        """Stop beating; `done`: this node finished (or stopped) with the others, so that
        they do not take its silence for a loss."""
        self._mark_done = done
        self._stop.set()
        for t in (self._judge_thread, self._beat_thread):
            if t.is_alive():
                t.join(timeout=2 * self.interval + 2)

    # -- the beat ------------------------------------------------------------------------

    def _beat_loop(self) -> None:
        while True:
            self._beat()
            if self._stop.wait(self.interval):
                break
        if self._mark_done:
            try:
                self.store.set(f"done/{self.d.node_rank}", "1")
            except (RuntimeError, OSError) as exc:
                log.warning("nodewatch: could not mark node %d done: %s", self.d.node_rank, exc)

    def _beat(self) -> None:
        try:
            self.store.add(f"beat/{self.d.node_rank}", 1)
            for r in self.others:
                if r in self._done:
                    continue
                if self.store.check([f"done/{r}"]):
                    self._done.add(r)
                    continue
                count = self.store.add(f"beat/{r}", 0)
                with self._lock:
                    if count != self._count[r]:
                        self._count[r], self._changed[r] = count, time.monotonic()
        except (RuntimeError, OSError) as exc:  # DistStoreError and friends are RuntimeErrors
            with self._lock:
                self._store_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            return
        with self._lock:
            self._store_ok, self._store_error = time.monotonic(), None

    # -- the judge -----------------------------------------------------------------------

    def _judge_loop(self) -> None:
        while not self._stop.wait(self.interval):
            lost = self.suspect(self.timeout_s)
            if lost is not None:
                self._lost(lost)
                return

    def suspect(self, stale_s: float) -> str | None:
        """Why a node counts as lost when silence over `stale_s` is enough, or None."""
        now = time.monotonic()
        with self._lock:
            quiet = now - self._store_ok
            if quiet >= stale_s:
                # Nothing got through the store: node 0, which hosts it, is gone.
                whose = (self.d.describe(0) if self.d.node_rank != 0
                         else f"rank 0 of {self.d.nodes} (this node's torchrun agent)")
                why = f"; {self._store_error}" if self._store_error else ""
                return (f"{whose} lost: its rendezvous store at {self.endpoint} has not "
                        f"answered for {quiet:.0f} s{why}")
            for r in self.others:
                age = now - self._changed[r]
                if r not in self._done and age >= stale_s:
                    return f"{self.d.describe(r)} lost: no heartbeat for {age:.0f} s"
        return None

    def _lost(self, verdict: str) -> None:
        with self._lock:
            if self.verdict is not None:
                return
            self.verdict = verdict
            reporting = self._reporting
        if not reporting:
            self.on_lost(verdict)

    # -- after a failed collective -------------------------------------------------------

    def explain(self, wait_s: float | None = None) -> str | None:
        """Which node went, once a collective failed: waits (at most `wait_s`, default the
        node timeout) for a node's beat to stand still; None when every node still beats
        (the failure was something else)."""
        with self._lock:
            self._reporting = True
        deadline = time.monotonic() + (self.timeout_s if wait_s is None else wait_s)
        while True:
            if self.verdict is not None:
                return self.verdict
            found = self.suspect(self.stale_s)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.interval / 2)
