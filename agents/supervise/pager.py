"""Pages from the node: the supervisor posts each new alert and its clearing to `[alerts]
webhook` itself (Slack-compatible JSON, or ntfy's plain body), so a page needs no console.

Posting runs in its own task with a pooled client and explicit timeouts, never on the path of
a snapshot or a health check: `observe` only queues. The queue is bounded (`webhook_queue`):
while the receiver is down pages wait and are retried with backoff, nothing lost within the
bound, the oldest dropped and counted past it. At most `webhook_per_minute` posts go in any
minute: the last one a minute allows carries everything still waiting, as one summary post.
The URL is a secret (agents/rundir/secrets.py): no error, log line or status names it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import httpx
import msgspec

from agents.rundir.schema import Alert, PagerStatus

log = logging.getLogger("fleetdeck.pager")

PageKind = Literal["raised", "cleared"]
ICONS = {("raised", "critical"): ":rotating_light:", ("raised", "warning"): ":warning:"}
CLEARED_ICON = ":white_check_mark:"


@dataclass(slots=True)
class Page:
    kind: PageKind
    code: str
    severity: str
    message: str
    since: float  # when the alert was raised
    at: float  # when this change was seen


def page_line(page: Page, where: str) -> str:
    """One page for people: `:rotating_light: RAISED server_down:0 [critical] node/run: ...`.
    The word after the icon and the code are what a reader (or a test) keys on."""
    icon = ICONS.get((page.kind, page.severity), CLEARED_ICON)
    text = f"{icon} {page.kind.upper()} {page.code} [{page.severity}] {where}: {page.message}"
    if page.kind == "cleared":
        text += f" (raised {time.strftime('%H:%M', time.localtime(page.since))}, " \
                f"{(page.at - page.since) / 60:.0f} min)"
    return text


def request_body(pages: list[Page], fmt: str, where: str) -> tuple[bytes, dict[str, str]]:
    """The post for `pages` (one, or a summary of several): Slack's `{"text": ...}` (Slack,
    Mattermost, Rocket.Chat, Discord's /slack endpoint), or ntfy's plain body with its Title,
    Priority and Tags headers."""
    lines = [page_line(p, where) for p in pages]
    if len(pages) == 1:
        title = f"fleetdeck {where}: {pages[0].kind} {pages[0].code}"
        text = lines[0]
    else:
        title = f"fleetdeck {where}: {len(pages)} alert changes"
        text = f"{title} (rate limited: one summary post)\n" + "\n".join(lines)
    if fmt == "slack":
        return msgspec.json.encode({"text": text}), {"Content-Type": "application/json"}
    raised = [p.severity for p in pages if p.kind == "raised"]
    priority = "urgent" if "critical" in raised else "high" if raised else "default"
    tags = "rotating_light" if raised else "white_check_mark"
    # HTTP header values are Latin-1 at most: a host name or message with other text in it
    # keeps its full form in the body.
    return text.encode(), {"Title": title.encode("ascii", "replace").decode(),
                           "Priority": priority, "Tags": tags,
                           "Content-Type": "text/plain; charset=utf-8"}


class Pager:
    def __init__(self, url: str, fmt: str, where: str, per_minute: int = 6,
                 queue_max: int = 200, window_s: float = 60.0, backoff_s: float = 1.0,
                 backoff_max_s: float = 60.0, timeout_s: float = 10.0) -> None:
        self._url = url
        self.fmt = fmt
        self.where = where  # `host/run`, in every page
        self.per_minute = per_minute
        self.queue_max = queue_max
        self.window_s = window_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.timeout_s = timeout_s
        self.status = PagerStatus(format=fmt)
        self._queue: deque[Page] = deque()
        self._inflight: list[Page] = []
        self._open: dict[str, Alert] = {}  # alerts raised (queued) and not cleared since
        self._posted_at: deque[float] = deque()  # monotonic times of posts in the window
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the supervisor's side: never blocks ----------------------------------------------

    def observe(self, alerts: list[Alert], now: float) -> None:
        """Queue a page for each alert not seen before and for each one gone since; mark
        every alert `paged` (this node took it: the console does not page it again)."""
        current = {a.code: a for a in alerts}
        for a in alerts:
            if a.code not in self._open:
                self._put(Page("raised", a.code, a.severity, a.message, a.since, now))
            a.paged = True
        for code, a in list(self._open.items()):
            if code not in current:
                self._put(Page("cleared", code, a.severity, a.message, a.since, now))
        self._open = current

    def _put(self, page: Page) -> None:
        self._queue.append(page)
        self._trim()
        self._idle.clear()
        self._wake.set()

    def _trim(self) -> None:
        excess = len(self._queue) + len(self._inflight) - self.queue_max
        while excess > 0 and self._queue:
            lost = self._queue.popleft()
            self.status.dropped += 1
            excess -= 1
            log.warning("page dropped (queue full at %d, receiver down?): %s %s",
                        self.queue_max, lost.kind, lost.code)
        self.status.pending = len(self._queue) + len(self._inflight)

    def snapshot(self) -> PagerStatus:
        return msgspec.structs.replace(self.status)

    # -- the posting task -----------------------------------------------------------------

    async def run(self) -> None:
        """Post until cancelled. One client, reused, with explicit timeouts."""
        timeout = httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 5.0))
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False,
                                     trust_env=False) as client:
            failures_in_row = 0
            while True:
                if not self._queue:
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                wait = self._rate_wait()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                # The last post a minute allows carries everything waiting.
                last_slot = len(self._posted_at) >= self.per_minute - 1
                n = len(self._queue) if last_slot else 1
                self._inflight = [self._queue.popleft() for _ in range(n)]
                retry_after = await self._post(client, self._inflight)
                batch, self._inflight = self._inflight, []
                if retry_after is None:
                    failures_in_row = 0
                else:
                    self._queue.extendleft(reversed(batch))  # in order, at the front
                    failures_in_row += 1
                    delay = retry_after or min(self.backoff_max_s,
                                               self.backoff_s * 2 ** (failures_in_row - 1))
                self._trim()
                if retry_after is not None:
                    await asyncio.sleep(delay)

    def _rate_wait(self) -> float:
        now = time.monotonic()
        while self._posted_at and now - self._posted_at[0] >= self.window_s:
            self._posted_at.popleft()
        if len(self._posted_at) < self.per_minute:
            return 0.0
        return self._posted_at[0] + self.window_s - now

    async def _post(self, client: httpx.AsyncClient, batch: list[Page]) -> float | None:
        """None: done with `batch` (taken, or refused for good and counted dropped); else
        retry it after that many seconds (0: the backoff's)."""
        body, headers = request_body(batch, self.fmt, self.where)
        try:
            r = await client.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return self._failed(f"{type(exc).__name__}: {self._scrub(str(exc)) or 'no detail'}",
                                0.0)
        except httpx.InvalidURL:
            # The spec's check lets only http(s)://host through; a URL httpx still refuses
            # fails the same way every time.
            self.status.dropped += len(batch)
            self._note(f"[alerts] webhook is not a URL httpx can post to: {len(batch)} "
                       "page(s) dropped")
            return None
        self._posted_at.append(time.monotonic())
        if r.is_success:
            self.status.posted += 1
            self.status.pages += len(batch)
            self.status.last_posted_at = time.time()
            return None
        if r.status_code in (408, 429) or r.status_code >= 500:
            after = r.headers.get("Retry-After", "")
            # ASCII digits only: "²".isdigit() holds, and float("²") raises.
            seconds = after.isascii() and after.isdigit()
            wait = min(float(after), self.backoff_max_s) if seconds else 0.0
            return self._failed(f"the receiver answered {r.status_code}", wait)
        # Any other 4xx says the same to every retry (a revoked hook, a bad body).
        self.status.dropped += len(batch)
        self._note(f"the receiver answered {r.status_code}: {len(batch)} page(s) dropped; "
                   "check [alerts] webhook and webhook_format")
        return None

    def _failed(self, why: str, wait: float) -> float:
        self.status.failures += 1
        self._note(f"{why}; retrying")
        return wait

    def _note(self, error: str) -> None:
        self.status.last_error = error
        self.status.last_error_at = time.time()
        log.warning("webhook: %s (%d pending)", error,
                    len(self._queue) + len(self._inflight))

    def _scrub(self, text: str) -> str:
        """An error's text without the URL or its path (where Slack keeps the key)."""
        rest = self._url.partition("://")[2]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        path = rest[cut:]  # its path and query: where a hook's key is
        text = text.replace(self._url, "[webhook]")
        return text.replace(path, "/[secret]") if len(path) > 1 else text

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` for every queued page to go (a clearing at shutdown)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("webhook: %d page(s) not posted at exit",
                        len(self._queue) + len(self._inflight))
