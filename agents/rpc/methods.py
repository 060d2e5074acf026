"""RPC methods that need no live supervisor: live controls (through control.json, as the
headless CLI does), logs, samples, history, the failures summary, the artifact manifest,
verify and the hello handshake. The supervisor and `serve --stdio` (when no supervisor runs)
both answer with these."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from agents import PROTOCOL_VERSION, __version__
from agents.artifacts.manifest import MAX_LIMIT, Manifest
from agents.artifacts.verify import VerifyError, verify_run
from agents.queue import node as queue_node
from agents.rpc.protocol import INVALID_PARAMS, REFUSED, VERSION_MISMATCH, Handler, RpcError
from agents.rundir.browse import (
    OutsideRunDir,
    history,
    log_path,
    recent_samples,
    since,
    tail,
)
from agents.rundir.control import (
    ControlError,
    parse_resize_value,
    resize_refusal,
    update_control,
)
from agents.rundir.control import resize as control_resize
from agents.rundir.failsummary import FailureSummarizer
from agents.rundir.histstore import HistoryError, read_history
from agents.rundir.schema import Control
from agents.supervise.export_job import ExportRefused, start_export

MAX_LOG_LINES = 5000


def check_hello(params: dict[str, Any], run_dir: Path, supervised: bool) -> dict[str, Any]:
    theirs = params.get("protocol")
    if theirs != PROTOCOL_VERSION:
        raise RpcError(VERSION_MISMATCH,
                       f"the console speaks protocol {theirs}, this agent ({__version__}) "
                       f"speaks {PROTOCOL_VERSION}: run `fleetdeck bootstrap NODE` to upgrade "
                       "the agent (or upgrade the console)",
                       {"agent_protocol": PROTOCOL_VERSION, "agent_version": __version__})
    return {"protocol": PROTOCOL_VERSION, "agent_version": __version__,
            "host": socket.gethostname(), "run_dir": str(run_dir), "supervised": supervised}


def _int(params: dict[str, Any], key: str, low: int = 0) -> int:
    value = params.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise RpcError(INVALID_PARAMS, f"{key} must be a whole number >= {low}, got {value!r}")
    return value


class ControlMethods:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        # Kept for the life of the answering process (the supervisor's, or a serve session's):
        # each `failures` call reads only what the journal gained since the last one.
        self.failures = FailureSummarizer(run_dir)

    def _write(self, method: str, params: dict[str, Any], change: Any) -> dict[str, Any]:
        public = {k: v for k, v in params.items() if k != "who"}
        try:
            c: Control = update_control(self.run_dir, method, public, change, params.get("who"))
        except ControlError as exc:
            raise RpcError(REFUSED, str(exc)) from None
        return {"rev": c.rev}

    def methods(self) -> dict[str, Handler]:
        async def pause(p: dict[str, Any]) -> Any:
            return self._write("pause", p, lambda c: setattr(c, "paused", True))

        async def unpause(p: dict[str, Any]) -> Any:
            return self._write("unpause", p, lambda c: setattr(c, "paused", False))

        async def resize(p: dict[str, Any]) -> Any:
            try:
                value = parse_resize_value(p.get("value"))
            except ControlError as exc:
                raise RpcError(INVALID_PARAMS, str(exc)) from None
            server = p.get("server")
            number = None if server is None else _int(p, "server")
            refusal = resize_refusal(self.run_dir, value, number)
            if refusal is not None:
                raise RpcError(INVALID_PARAMS, refusal)
            return self._write("resize", p, lambda c: control_resize(c, value, number))

        async def max_tokens(p: dict[str, Any]) -> Any:
            value = _int(p, "value", 1)
            return self._write("max_tokens", p, lambda c: setattr(c, "max_tokens", value))

        async def retry(p: dict[str, Any]) -> Any:
            what = p.get("what")
            if what not in ("failed", "truncated"):
                raise RpcError(INVALID_PARAMS, f"what must be failed or truncated, got {what!r}")
            if p.get("long_only"):
                if what != "truncated":
                    raise RpcError(INVALID_PARAMS, "long_only goes with truncated only")
                what = "long"  # the truncated indices whose line is not a loop
            return self._write("retry", p, lambda c: setattr(
                c.retry, what, getattr(c.retry, what) + 1))

        async def logs(p: dict[str, Any]) -> Any:
            name = p.get("name", "generate")
            if not isinstance(name, str):
                raise RpcError(INVALID_PARAMS, f"name must be a log name, got {name!r}")
            n = min(_int({"n": p.get("n", 100)}, "n"), MAX_LOG_LINES)
            if "from" in p:  # following: what the log gained since an earlier answer
                if "before" in p:
                    raise RpcError(INVALID_PARAMS, "give from (read on) or before (read "
                                   "back), not both")
                offset = _int(p, "from")
                inode = None if p.get("inode") is None else _int(p, "inode")
                mid_line = p.get("mid_line", False)
                if not isinstance(mid_line, bool):
                    raise RpcError(INVALID_PARAMS, f"mid_line must be true or false, got "
                                   f"{mid_line!r}")
                return await asyncio.to_thread(
                    _read_log, self.run_dir, name,
                    lambda path: since(path, offset, inode, n, mid_line))
            before = p.get("before")
            # Off the loop: a slow disk (or anything odd in logs/) never stalls other sessions.
            return await asyncio.to_thread(
                _read_log, self.run_dir, name,
                lambda path: tail(path, n, before if isinstance(before, int) else None))

        async def samples(p: dict[str, Any]) -> Any:
            n = min(_int({"n": p.get("n", 10)}, "n"), 200)
            return {"samples": await asyncio.to_thread(recent_samples, self.run_dir, n)}

        async def history_(p: dict[str, Any]) -> Any:
            since = p.get("since", 0.0)
            if not isinstance(since, (int, float)) or isinstance(since, bool):
                raise RpcError(INVALID_PARAMS, f"since must be a number, got {since!r}")
            limit = min(_int({"limit": p.get("limit", 1000)}, "limit"), 5000)
            if "span" not in p and "resolution" not in p:
                # Samples as written, paged by `offset` (`since` for consoles before it).
                offset = None if p.get("offset") is None else _int(p, "offset")
                try:
                    return await asyncio.to_thread(history, self.run_dir, float(since), limit,
                                                   offset)
                except ValueError as exc:
                    raise RpcError(INVALID_PARAMS, str(exc)) from None
            resolution = p.get("resolution")
            if resolution is not None:
                resolution = _int(p, "resolution", 10)
            try:
                # Off the loop: the first call on a run may rebuild the compacted copy.
                window = await asyncio.to_thread(
                    read_history, self.run_dir, p.get("span", "1h"),
                    float(since) if since else None, resolution, max(1, limit))
            except HistoryError as exc:
                raise RpcError(INVALID_PARAMS, str(exc)) from None
            return window.reply()

        async def failures(p: dict[str, Any]) -> Any:
            try:
                # Off the loop (the engine's, in a supervisor): it reads the journal.
                summary = await asyncio.to_thread(self.failures.summary)
            except OSError as exc:
                raise RpcError(REFUSED, str(exc)) from None
            return msgspec.to_builtins(summary)

        async def manifest(p: dict[str, Any]) -> Any:
            offset = _int({"offset": p.get("offset", 0)}, "offset")
            limit = min(_int({"limit": p.get("limit", 1000)}, "limit", 1), MAX_LIMIT)
            try:
                # Off the loop: a page may hash large files (a checkpoint, a long log).
                page = await asyncio.to_thread(Manifest(self.run_dir).page, offset, limit,
                                               p.get("prefix", ""), p.get("path"))
            except OutsideRunDir as exc:
                raise RpcError(REFUSED, str(exc)) from None
            return msgspec.to_builtins(page)

        async def verify(p: dict[str, Any]) -> Any:
            try:
                # Off the loop: it reads every batch and asks S3; the loop keeps answering.
                report = await asyncio.to_thread(verify_run, self.run_dir)
            except VerifyError as exc:
                raise RpcError(REFUSED, str(exc)) from None
            return msgspec.to_builtins(report)

        async def queue_status(p: dict[str, Any]) -> Any:
            return await asyncio.to_thread(_queue_call, queue_node.status, self.run_dir)

        async def queue_verify(p: dict[str, Any]) -> Any:
            deep = p.get("deep", 0.0)
            if not isinstance(deep, (int, float)) or isinstance(deep, bool) or \
                    not 0.0 <= deep <= 1.0:
                raise RpcError(INVALID_PARAMS, f"deep must be a share 0..1, got {deep!r}")
            # Off the loop: it reads every commit and HEADs every batch they name.
            return await asyncio.to_thread(_queue_call, queue_node.verify_report, self.run_dir,
                                           float(deep))

        async def queue_retry(p: dict[str, Any]) -> Any:
            what = p.get("what")
            if what not in ("failed", "truncated"):
                raise RpcError(INVALID_PARAMS, f"what must be failed or truncated, got {what!r}")
            if p.get("long_only"):
                # A campaign's retry is built from its commits, which keep no loop bits.
                raise RpcError(INVALID_PARAMS, "--long-only is a node's retry, not a "
                               "campaign's: retry each node, or the campaign's truncated all")
            mt = p.get("max_tokens")
            if mt is not None:
                mt = _int(p, "max_tokens", 1)
            who = p.get("who")
            return await asyncio.to_thread(_queue_call, queue_node.retry, self.run_dir, what,
                                           mt, who if isinstance(who, str) else None)

        async def queue_give_back(p: dict[str, Any]) -> Any:
            return await asyncio.to_thread(_queue_call, queue_node.give_back, self.run_dir)

        async def export(p: dict[str, Any]) -> Any:
            checkpoint = p.get("checkpoint", "best")
            try:
                return await asyncio.to_thread(start_export, self.run_dir, str(checkpoint),
                                               p.get("who"))
            except ExportRefused as exc:
                raise RpcError(REFUSED, str(exc)) from None

        return {"export": export, "pause": pause, "unpause": unpause, "resize": resize,
                "max_tokens": max_tokens,
                "retry": retry, "logs": logs, "samples": samples, "history": history_,
                "failures": failures, "manifest": manifest, "verify": verify,
                "queue_status": queue_status, "queue_verify": queue_verify,
                "queue_retry": queue_retry, "queue_give_back": queue_give_back}


def _queue_call(fn: Any, *args: Any) -> Any:
    """A queue call on this run's campaign; refusals (not a campaign node, a retry that
    must wait, a node that still holds work) as REFUSED with their reason."""
    from agents.queue.retry import RetryRefused

    try:
        return fn(*args)
    except (queue_node.NotAQueueRun, RetryRefused, ValueError) as exc:
        raise RpcError(REFUSED, str(exc)) from None


def _read_log(run_dir: Path, name: str,
              read: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """`read` on a log found by name (its tail, or what it gained); refused (never read)
    when the name is a path or the file is a symlink, a FIFO or anything but a regular
    file."""
    try:
        return read(log_path(run_dir, name))
    except OutsideRunDir as exc:
        raise RpcError(REFUSED, str(exc)) from None
    except OSError as exc:
        raise RpcError(REFUSED, f"{name}: {exc.strerror or exc}; refused") from None
