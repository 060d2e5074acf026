"""Alerts: conditions an on-call engineer must see, each with a reason and since when.

Rates are judged over a recent window of samples, not the lifetime: a run that was fine for ten
hours and is failing now must say so now. An alert clears when its condition does.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections import deque
from dataclasses import dataclass

from agents.rundir.gpugroups import label
from agents.rundir.schema import Alert, DiskStatus, Progress, ServerStatus
from agents.rundir.spec import AlertsSection
from agents.supervise.acceptdrift import AcceptLevels, fleet_drift, server_drop


@dataclass(slots=True)
class _Sample:
    t: float
    completed: int
    failed: int
    truncated: int
    empty: int
    server_completed: dict[str, int]
    answers_by_limit: dict[str, int]
    truncated_by_limit: dict[str, int]
    loops: int = 0  # of `truncated`, repetition loops (agents/engine/loops.py)


def loop_advice(cut: int, loops: int) -> str:
    """What to do about `cut` truncated answers of which `loops` ended in a repetition loop:
    loops gain nothing from more tokens, so only the long ones are worth a retry."""
    if cut <= 0 or loops <= 0:
        return ""  # no loops seen: the plain advice (raise max_tokens, retry truncated) holds
    long = max(0, cut - loops)
    split = f" ({loops} of {cut} cut are loops, {long} long)"
    if long == 0:
        return (f"{split}: more max_tokens buys more of the same; look at `samples` and the "
                "sampling (repetition/presence penalty, temperature) instead of retrying")
    return (f"{split}: raise max_tokens for the long ones, then `retry truncated --long-only` "
            "(retrying the loops doubles their cost for nothing)")


# What to do about idle GPUs: console actions (console/actions.py), named by id.
IDLE_ACTIONS = ["pull", "decommission"]
KV_ADVICE = "lower concurrency or max_tokens"


@dataclass(slots=True)
class _Queue:
    """One look at a server's queue and KV pool (SGLang's own figures)."""

    t: float
    queued: int
    token_usage: float | None
    running: int | None


def kv_pressure(s: ServerStatus, looks: deque[_Queue], cfg: AlertsSection,
                window_s: float) -> str | None:
    """Why server `s` is short of KV room, or None: it retracted at least `kv_retractions`
    requests in the window (running requests sent back to its queue, to start again), or its
    queue grew over the window while it ran under its running cap with token usage at least
    `kv_usage` (what else keeps a request waiting there is the cap: over_cap's case)."""
    where_ = f"server {s.number} ({where(s)})"
    usage = f"token usage {s.token_usage:.0%}" if s.token_usage is not None else \
        "token usage unknown"
    queued = f"{s.queued_reqs} queued" if s.queued_reqs is not None else "queue unknown"
    pool = f" of {s.kv_capacity_tokens:,} tokens" if s.kv_capacity_tokens else ""
    minutes = f"{window_s / 60:g} min"
    if cfg.kv_retractions and s.retracted_recent is not None and \
            s.retracted_recent >= cfg.kv_retractions:
        return (f"{where_}: KV cache full: {s.retracted_recent} request"
                f"{'s' if s.retracted_recent != 1 else ''} retracted in the last {minutes} "
                f"({usage}{pool}, {queued}): {KV_ADVICE}")
    if len(looks) < 2:
        return None
    first, last = looks[0], looks[-1]
    cap = s.effective_max_running
    if last.queued > first.queued and last.token_usage is not None and \
            last.token_usage >= cfg.kv_usage and \
            (cap is None or last.running is None or last.running < cap):
        running = f"{last.running} running" if last.running is not None else "running unknown"
        return (f"{where_}: KV cache full: its queue grew from {first.queued} to {last.queued} "
                f"in the last {minutes} with {running} ({usage}{pool}): {KV_ADVICE}")
    return None


def servers_held_idle(progress: Progress | None, servers: list[ServerStatus]
                      ) -> list[ServerStatus]:
    """This node's own servers still up after its run ended (done or stopped); none while it
    runs. Servers started elsewhere ([servers] urls: no pid here) are not ours to give back."""
    if progress is None or progress.status not in ("done", "stopped"):
        return []
    return [s for s in servers
            if s.pid is not None and s.state in ("healthy", "degraded", "starting")]


def gpus_held(servers: list[ServerStatus]) -> int:
    """The GPUs these servers hold: a server on a group holds all of it."""
    return sum(len(group) if (group := s.gpu_group) else 1 for s in servers)


def where(s: ServerStatus) -> str:
    """`GPU 0-1` for a server the supervisor launched, its URL for one started elsewhere."""
    group = s.gpu_group
    return f"GPU {label(group)}" if group else s.url


def truncation_at_limit(first: _Sample, progress: Progress) -> tuple[float, int] | None:
    """The share of answers cut among those that ran with today's max_tokens since `first`,
    and how many there were; None from an engine that does not count per limit."""
    if not progress.answers_by_limit:
        return None
    key = str(progress.max_tokens)
    answers = progress.answers_by_limit.get(key, 0) - first.answers_by_limit.get(key, 0)
    cut = progress.truncated_by_limit.get(key, 0) - first.truncated_by_limit.get(key, 0)
    return (cut / answers if answers > 0 else 0.0), answers


class AlertBook:
    def __init__(self, cfg: AlertsSection, host: str | None = None) -> None:
        self.cfg = cfg
        self.host = host or socket.gethostname()
        self._samples: deque[_Sample] = deque()
        self._since: dict[str, float] = {}
        self._last_completion: dict[str, float] = {}
        self._accept_sum = 0.0
        self._accept_n = 0
        # (since, max_tokens): when each limit was set, to name the ones answers ran with.
        self._limits: list[tuple[float, int]] = []
        self._idle_from: float | None = None
        self._queues: dict[int, deque[_Queue]] = {}  # each server's looks over the window
        # Accept lengths from the history store, set by the supervisor as it refreshes them.
        self.levels: AcceptLevels | None = None

    def _note_limit(self, now: float, max_tokens: int) -> None:
        if not self._limits or self._limits[-1][1] != max_tokens:
            self._limits.append((now, max_tokens))
        horizon = now - 3 * self.cfg.window_s
        while len(self._limits) > 1 and self._limits[1][0] < horizon:
            self._limits.pop(0)

    def _truncation_message(self, share: float, window_start: float) -> str:
        """Names the max_tokens the truncated answers ran with, not only today's: an answer
        finishing in the window may have started up to a window before it, under the limit
        of then (after a raise from 4096 to 8192, answers cut at 4096 keep arriving)."""
        horizon = window_start - self.cfg.window_s
        ran = [(since, limit) for i, (since, limit) in enumerate(self._limits)
               if i + 1 == len(self._limits) or self._limits[i + 1][0] > horizon]
        now_limit = ran[-1][1]
        if len(ran) == 1:
            return (f"{share:.1%} of recent answers hit max_tokens {now_limit}: consider "
                    "raising max_tokens")
        steps = ", ".join(f"{limit} until {time.strftime('%H:%M', time.localtime(until))}"
                          for (_, limit), (until, _) in itertools.pairwise(ran))
        text = (f"{share:.1%} of recent answers hit the max_tokens they ran with ({steps}, "
                f"{now_limit} since)")
        if now_limit > max(limit for _, limit in ran[:-1]):
            text += (f": those cut under a lower limit can run again at {now_limit} "
                     "(retry truncated)")
        return text

    def _queue_looks(self, s: ServerStatus, now: float) -> deque[_Queue]:
        """The server's queue over the window, with this look; a server whose figures are
        unknown now (down, not read yet) starts over."""
        looks = self._queues.setdefault(s.number, deque())
        if s.queued_reqs is None or s.state not in ("healthy", "degraded"):
            looks.clear()
            return looks
        looks.append(_Queue(now, s.queued_reqs, s.token_usage, s.running_reqs))
        while len(looks) > 1 and now - looks[0].t > self.cfg.window_s:
            looks.popleft()
        return looks

    def _window(self, now: float) -> _Sample | None:
        while len(self._samples) > 1 and now - self._samples[1].t >= self.cfg.window_s:
            self._samples.popleft()
        return self._samples[0] if self._samples else None

    def evaluate(self, progress: Progress | None, servers: list[ServerStatus],
                 disk: DiskStatus | None, now: float | None = None) -> list[Alert]:
        now = time.time() if now is None else now
        raised: dict[str, tuple[str, str, int | None]] = {}

        def alert(code: str, severity: str, message: str, server: int | None = None) -> None:
            raised[code] = (severity, message, server)

        held = servers_held_idle(progress, servers)
        gpus = gpus_held(held)
        if not held or progress is None:
            self._idle_from = None
        elif self._idle_from is None:
            # A live engine stamps every snapshot now; one read from disk says when it ended.
            self._idle_from = min(now, progress.updated_at)
        ended = self._idle_from
        if ended is not None and now - ended >= self.cfg.idle_alert_s:
            cost = ""
            if progress is not None and progress.cost is not None:
                burn = progress.cost.per_gpu_hour * gpus
                cost = f", ${burn:,.2f}/h: ${burn * (now - ended) / 3600:,.2f} so far"
            status = progress.status if progress is not None else "over"
            alert("idle", "warning",
                  f"GPUs idle on {self.host} — pull and decommission (the run has been "
                  f"{status} for {(now - ended) / 60:.0f} min; {len(held)} server(s)"
                  + (f" on {gpus} GPUs" if gpus != len(held) else "") + f" still up{cost})")

        for s in servers:
            if s.state in ("down", "restarting"):
                alert(f"server_down:{s.number}", "critical",
                      f"server {s.number} ({where(s)}) "
                      f"is {s.state}"
                      + (f": {s.last_error}" if s.last_error else ""), s.number)
            looks = self._queue_looks(s, now)
            why = kv_pressure(s, looks, self.cfg, self.cfg.window_s)
            if why is not None:
                alert(f"kv_pressure:{s.number}", "warning", why, s.number)
            cap = s.effective_max_running
            if cap is not None and s.limit > cap:
                alert(f"over_cap:{s.number}", "warning",
                      f"server {s.number}: {s.limit} requests in flight allowed but the server "
                      f"runs at most {cap}; the rest only queue there (resize to {cap})",
                      s.number)

        if progress is not None:
            running = progress.status in ("running", "draining")
            first = self._window(now)
            self._note_limit(now, progress.max_tokens)
            self._samples.append(_Sample(now, progress.completed, progress.failed,
                                         progress.truncated, progress.empty,
                                         {k: v.completed for k, v in progress.servers.items()},
                                         dict(progress.answers_by_limit),
                                         dict(progress.truncated_by_limit),
                                         progress.truncated_loops))
            prev = self._samples[-2] if len(self._samples) > 1 else None
            if prev is None or progress.completed > prev.completed:
                self._last_completion.setdefault("run", now)
                if prev is not None:
                    self._last_completion["run"] = now
            for name, sp in progress.servers.items():
                before = prev.server_completed.get(name) if prev is not None else None
                if before is None or sp.completed > before:
                    self._last_completion[name] = now
            stall_s = self.cfg.stall_minutes * 60
            if running and not progress.paused:
                idle = now - self._last_completion.get("run", now)
                if idle >= stall_s:
                    alert("stall", "critical",
                          f"no completion in the whole run for {idle / 60:.1f} min")
                for name, sp in progress.servers.items():
                    idle = now - self._last_completion.get(name, now)
                    if sp.state == "healthy" and sp.in_flight > 0 and idle >= stall_s:
                        alert(f"stall:{name}", "warning",
                              f"server {name}: no completion for {idle / 60:.1f} min "
                              f"with {sp.in_flight} in flight", int(name))
            if first is not None:
                done = progress.completed - first.completed
                fails = progress.failed - first.failed
                attempts = done + fails
                if attempts >= self.cfg.min_samples and fails / attempts > self.cfg.failure_rate:
                    alert("failure_rate", "critical",
                          f"{fails / attempts:.1%} of requests failed in the last "
                          f"{self.cfg.window_s / 60:g} min (threshold "
                          f"{self.cfg.failure_rate:.0%})")
                judged = truncation_at_limit(first, progress)
                if judged is not None:
                    # Only answers that ran with today's limit: after a raise, answers cut
                    # under the old one keep arriving and say nothing of the new limit.
                    share, answers = judged
                    advice = loop_advice(progress.truncated - first.truncated,
                                         progress.truncated_loops - first.loops)
                    if answers >= self.cfg.min_samples and share > self.cfg.truncation_rate:
                        alert("truncation_rate", "warning",
                              f"{share:.1%} of the last {answers} answers at max_tokens "
                              f"{progress.max_tokens} hit it: consider raising max_tokens"
                              f"{advice}")
                elif done >= self.cfg.min_samples:
                    trunc = (progress.truncated - first.truncated) / done
                    if trunc > self.cfg.truncation_rate:
                        alert("truncation_rate", "warning",
                              self._truncation_message(trunc, first.t)
                              + loop_advice(progress.truncated - first.truncated,
                                            progress.truncated_loops - first.loops))
                if done >= self.cfg.min_samples:
                    empty = (progress.empty - first.empty) / done
                    if empty > self.cfg.empty_rate:
                        alert("empty_rate", "critical",
                              f"{empty:.1%} of recent answers are empty or reasoning-only: "
                              "look at `samples` before this data goes anywhere")
            accepts = [sp.accept_length for sp in progress.servers.values()
                       if sp.accept_length is not None]
            if accepts:
                # Until the history has a baseline (a new run): the mean seen by this book.
                self._accept_sum += sum(accepts) / len(accepts)
                self._accept_n += 1
                run_avg = self._accept_sum / self._accept_n
                for s in servers:
                    acc = s.accept_length_window or s.accept_length
                    why = server_drop(s.number, acc, self.levels, run_avg, self.cfg) \
                        if acc is not None and s.state == "healthy" else None
                    if why is not None:
                        alert(f"accept_drop:{s.number}", "warning", why, s.number)
            drift = fleet_drift(self.levels, self.cfg)
            if drift is not None and running:
                alert("accept_drift", "warning", drift)

        if disk is not None and disk.hours_to_full is not None and \
                disk.hours_to_full < self.cfg.disk_hours:
            alert("disk_full", "critical",
                  f"{disk.path}: disk full in {disk.hours_to_full:.1f} h at the current rate "
                  f"({disk.free_bytes / 2**30:.1f} GiB free)")

        for code in list(self._since):
            if code not in raised:
                del self._since[code]
        if "idle" in raised and ended is not None:
            self._since.setdefault("idle", ended)
        out = []
        for code, (severity, message, server) in sorted(raised.items()):
            since = self._since.setdefault(code, now)
            out.append(Alert(code=code, severity=severity,  # type: ignore[arg-type]
                             message=message, since=since, server=server,
                             actions=list(IDLE_ACTIONS) if code == "idle" else []))
        return out
