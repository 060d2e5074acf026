"""`fleetdeck-agent serve --stdio RUN_DIR`: one per console SSH session, thin and stateless.

It relays JSON-RPC lines between the SSH channel and the run's supervisor socket; when no
supervisor runs it answers from the run directory itself, and starts a supervisor on
`launch`/`resume`. A malformed line gets an error and the session goes on.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from agents.engine import EngineError
from agents.rpc.campaign import (
    launch_check,
    launch_overrides,
    spec_for_launch,
)
from agents.rpc.methods import ControlMethods, check_hello
from agents.rpc.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    NO_ANSWER,
    NOT_RUNNING,
    PARSE_ERROR,
    REFUSED,
    STREAM_LIMIT,
    RequestUnreadable,
    RpcClient,
    RpcError,
    decode_request,
    dispatch_line,
    encode,
    error_reply,
    notification,
)
from agents.rpc.train_launch import train_overrides
from agents.rundir.control import who as local_who
from agents.rundir.spec import SpecError, load_run_spec
from agents.supervise.launch import RunCtlError, connect, resume
from agents.supervise.snapshot import from_disk

PUSH_INTERVAL_S = float(os.environ.get("FLEETDECK_PUSH_INTERVAL_S", "1.0"))


class _ReplyId(msgspec.Struct):
    id: Any = None


_reply_id = msgspec.json.Decoder(_ReplyId)

# What a `--read-only` session answers: looking only. Everything else (launch, resume, stop,
# down, restart_server, pause, unpause, resize, max_tokens, retry, manifest, whose hash cache
# is written, and any method added later) is refused before it reaches a supervisor.
READ_ONLY_METHODS = frozenset({"hello", "status", "subscribe", "unsubscribe", "logs", "samples",
                               "history", "failures", "verify", "queue_status",
                               "queue_verify"})


def _read_only_refusal(method: str, run_dir: Path) -> str:
    shown = method if method.isprintable() and len(method) <= 64 else repr(method[:64])
    return (f"{shown}: refused, this is a read-only session on {run_dir} (it may use "
            f"{', '.join(sorted(READ_ONLY_METHODS))}); changes need a normal key")


class StdioSession:
    def __init__(self, run_dir: Path, out: asyncio.StreamWriter, read_only: bool = False,
                 who: str | None = None) -> None:
        self.run_dir = run_dir.resolve()
        self.out = out
        self.read_only = read_only
        self.upstream: RpcClient | None = None
        self.subscribed = False
        self.who = who or local_who()
        # Requests relayed to the supervisor and not yet answered: id -> method.
        self._pending: dict[int | str, str] = {}
        self._answered = asyncio.Event()
        self.local = ControlMethods(self.run_dir)
        self._pump: asyncio.Task[None] | None = None
        self._push: asyncio.Task[None] | None = None

    def kind(self) -> tuple[str, str]:
        try:
            spec = load_run_spec(self.run_dir)
            return spec.run.kind, spec.run.name
        except SpecError:
            return "generate", self.run_dir.name

    async def attach(self) -> bool:
        if self.upstream is not None:
            return True
        client = await connect(self.run_dir)
        if client is None:
            return False
        self.upstream = client
        self._pump = asyncio.create_task(self._relay_back())
        if self.subscribed:
            await self._forward({"jsonrpc": "2.0", "method": "subscribe", "params": {}})
        return True

    async def _relay_back(self) -> None:
        assert self.upstream is not None
        reader = self.upstream.reader
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                if self._pending:
                    try:
                        self._pending.pop(_reply_id.decode(line).id, None)
                    except (msgspec.DecodeError, TypeError):
                        pass
                    if not self._pending:
                        self._answered.set()
                self.out.write(line)
                await self.out.drain()
        except (ConnectionError, OSError, ValueError):
            pass
        # The supervisor went away: answer (and push, for a subscriber) from disk from now on.
        self.upstream = None
        lost, self._pending = self._pending, {}
        self._answered.set()
        # What it held is answered now, as unknown (a change may be journaled): a client must
        # not wait out its timeout for a reply that cannot come.
        try:
            for rid, method in lost.items():
                self.out.write(error_reply(rid, NO_ANSWER, f"{self.run_dir}: the supervisor "
                                           f"exited before answering {method}: it may or may "
                                           "not have been done (status tells)"))
            if lost:
                await self.out.drain()
        except (ConnectionError, OSError):
            pass
        if self.subscribed and self._push is None:
            self._push = asyncio.create_task(self._push_from_disk())

    async def _forward(self, req: dict[str, Any]) -> None:
        assert self.upstream is not None
        rid = req.get("id")
        if isinstance(rid, (int, str)):
            self._pending[rid] = str(req.get("method"))
            self._answered.clear()
        self.upstream.writer.write(encode(req))
        await self.upstream.writer.drain()

    async def answered(self, timeout: float) -> None:
        """Wait until the supervisor has answered every request relayed to it (at the end of
        the input: a client that writes its requests and closes still gets every answer)."""
        if self._pending and self.upstream is not None:
            try:
                await asyncio.wait_for(self._answered.wait(), timeout)
            except TimeoutError:
                pass

    async def handle(self, line: bytes) -> None:
        try:
            req = decode_request(line)
        except RequestUnreadable as exc:
            await self._reply(error_reply(None, PARSE_ERROR, str(exc)))
            return
        if isinstance(req, dict):
            if req.get("params") is None:
                req["params"] = {}
            params = req["params"]
            method = req.get("method")
            if self.read_only and isinstance(method, str) and method not in READ_ONLY_METHODS:
                if "id" in req:
                    await self._reply(error_reply(req.get("id"), REFUSED, _read_only_refusal(
                        method, self.run_dir)))
                return
            if isinstance(params, dict):
                # Who acted is the node's to say (the forced command's --who, else this
                # account and the SSH client's address): a client's own claim never counts.
                params["who"] = self.who
                if method == "subscribe":
                    self.subscribed = True
                if await self.attach():
                    await self._forward(req)
                    return
            line = encode(req)
        await self._reply(await dispatch_line(line, self.methods()))

    async def _reply(self, reply: bytes | None) -> None:
        if reply is not None:
            self.out.write(reply)
            await self.out.drain()

    def methods(self) -> dict[str, Any]:
        async def hello(p: dict[str, Any]) -> Any:
            return check_hello(p, self.run_dir, supervised=False)

        async def status(p: dict[str, Any]) -> Any:
            kind, name = self.kind()
            return msgspec.to_builtins(from_disk(self.run_dir, kind, name))

        async def subscribe(p: dict[str, Any]) -> Any:
            self.subscribed = True
            if self._push is None:
                self._push = asyncio.create_task(self._push_from_disk())
            return await status(p)

        async def unsubscribe(p: dict[str, Any]) -> Any:
            self.subscribed = False
            return {"ok": True}

        async def launch(p: dict[str, Any]) -> Any:
            from agents.supervise.launch import up

            spec_path = p.get("spec")
            overrides = launch_overrides(p, self.run_dir) | train_overrides(p, spec_path)
            if p.get("check"):
                if not spec_path:
                    raise RpcError(INVALID_PARAMS, "check needs spec")
                return await asyncio.to_thread(launch_check, str(spec_path), self.run_dir,
                                               overrides)
            try:
                if spec_path:
                    spec = await asyncio.to_thread(spec_for_launch, str(spec_path), overrides)
                    result = await up(spec, p.get("who"))
                else:
                    result = await resume(self.run_dir, p.get("who"))
            except (SpecError, RunCtlError) as exc:
                raise RpcError(REFUSED, str(exc)) from None
            await self.attach()
            return result

        async def resume_(p: dict[str, Any]) -> Any:
            try:
                result = await resume(self.run_dir, p.get("who"))
            except RunCtlError as exc:
                raise RpcError(REFUSED, str(exc)) from None
            await self.attach()
            return result

        async def resume_from_s3(p: dict[str, Any]) -> Any:
            """A lost disk: this run directory rebuilt from S3 (`params.spec`: the run.toml on
            this node), then started."""
            from agents.artifacts.restore import RestoreRefused, restore_run_dir
            from agents.supervise.launch import up

            spec_path = p.get("spec")
            if not isinstance(spec_path, str) or not spec_path:
                raise RpcError(INVALID_PARAMS, "resume_from_s3 needs spec (the run.toml on the "
                               "node)")
            try:
                spec = await asyncio.to_thread(spec_for_launch, spec_path, {})
                if spec.run_dir.resolve() != self.run_dir:
                    raise RestoreRefused(f"{spec_path}: [run] dir is {spec.run_dir}, not this "
                                         f"session's {self.run_dir}")
                restored = await asyncio.to_thread(restore_run_dir, spec,
                                                   bool(p.get("retry_failed")))
                started = await up(spec, p.get("who"))
            except (SpecError, RestoreRefused, EngineError, RunCtlError) as exc:
                raise RpcError(REFUSED, str(exc)) from None
            await self.attach()
            return {**restored.to_json(), **started}

        async def needs_supervisor(p: dict[str, Any]) -> Any:
            raise RpcError(NOT_RUNNING, f"{self.run_dir}: no supervisor is running; "
                           "`resume` starts one")

        methods: dict[str, Any] = self.local.methods()
        methods.update(hello=hello, status=status, subscribe=subscribe,
                       unsubscribe=unsubscribe, launch=launch, resume=resume_,
                       resume_from_s3=resume_from_s3,
                       stop=needs_supervisor, down=needs_supervisor,
                       restart_server=needs_supervisor)
        return methods

    async def _push_from_disk(self) -> None:
        kind, name = self.kind()
        while True:
            await asyncio.sleep(PUSH_INTERVAL_S)
            if not self.subscribed:
                self._push = None
                return
            if self.upstream is not None:
                continue  # the supervisor pushes
            if await self.attach():
                continue
            snap = msgspec.to_builtins(from_disk(self.run_dir, kind, name))
            self.out.write(notification("status", snap))
            await self.out.drain()


async def serve_stdio(run_dir: Path, read_only: bool = False, who: str | None = None) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                        sys.stdout)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    session = StdioSession(run_dir, writer, read_only=read_only, who=who)
    while True:
        try:
            line = await reader.readline()
        except ValueError:
            writer.write(error_reply(None, -32600, f"line longer than {STREAM_LIMIT} bytes"))
            await writer.drain()
            continue
        if not line:
            break
        if not line.strip():
            continue
        try:
            await session.handle(line)
        except (ConnectionError, BrokenPipeError):
            break
        except Exception as exc:  # one bad request never ends the session
            writer.write(error_reply(None, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))
            await writer.drain()
    await session.answered(timeout=120.0)
    if session.upstream is not None:
        await session.upstream.close()
    return 0
