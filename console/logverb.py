"""The headless `logs NODE NAME [-n N] [--follow]`: a log's last lines, then (following) what
it gains, printed as it comes, over the one link opened (a call per interval on the same
channel) until Ctrl-C, which ends it with exit 0. Node text is shown escaped, never obeyed;
the console's own notes (a rotated log, lines passed over) go to stderr."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

from agents.rpc.protocol import INVALID_PARAMS, RpcError
from console.logfollow import BadLogAnswer, FollowedLog, Gained
from console.sanitize import shown
from console.transport import AgentLink

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

T = TypeVar("T")


class _Stopped(Exception):
    """Ctrl-C came while waiting."""


async def _unless(stop: asyncio.Event, work: Awaitable[T]) -> T:
    """`work`'s result, or _Stopped as soon as `stop` is set (the work cancelled)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise _Stopped
    return task.result()


def _print(node: str, name: str, gained: Gained) -> None:
    if gained.note is not None:
        print(f"{node}: {name}: {gained.note}", file=sys.stderr, flush=True)
    for line in gained.lines:
        print(shown(line, keep_tabs=True))  # a log line's escapes shown, not obeyed
    sys.stdout.flush()


async def print_log(link: AgentLink, node: str, args: argparse.Namespace) -> int:
    name: str = args.name
    follow: bool = getattr(args, "follow", False)
    interval: float = getattr(args, "interval", 1.0)
    if not interval > 0:
        print(f"fleetdeck logs: --interval must be above 0, got {interval}", file=sys.stderr)
        return EXIT_USAGE
    log = FollowedLog(name, max_lines=1)  # printed, not kept
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        first = True
        while True:
            params: dict[str, Any] = log.params(args.n)
            try:
                reply = await _unless(stop, link.call("logs", params, timeout=args.timeout))
                gained = log.apply(reply)
            except RpcError as exc:
                print(f"{node}: logs: {shown(exc.message)}", file=sys.stderr)
                return EXIT_USAGE if exc.code == INVALID_PARAMS else EXIT_CHECK
            except BadLogAnswer as exc:
                print(f"{node}: logs {shown(name)}: {exc}", file=sys.stderr)
                return EXIT_CHECK
            except (ConnectionError, TimeoutError) as exc:
                print(shown(exc), file=sys.stderr)
                return EXIT_UNREACHABLE
            if gained is not None:
                # Not following: the tail as it is, a line still being written included.
                if log.old_agent and not follow:
                    gained.note = None  # following was not asked for
                if first and not follow and gained.unfinished is not None:
                    gained.lines.append(gained.unfinished)
                _print(node, name, gained)
            first = False
            if not follow or log.old_agent:  # an old agent's tail: shown, never followed
                return EXIT_OK
            await _unless(stop, asyncio.sleep(interval))
    except _Stopped:
        return EXIT_OK
    except BrokenPipeError:  # the reader went (`| head`): done, quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
