"""Reaching a node's agent: one long-lived `fleetdeck-agent serve --stdio` channel per node,
over SSH (asyncssh, host keys checked against known_hosts) or a local subprocess (the demo and
tests: the same bytes). JSON-RPC replies go to their callers; pushed snapshots to a callback.

On a drop the link reconnects with backoff while the node shows `reconnecting` and the age of
its last snapshot; one slow or dead node never holds up another.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import msgspec

from agents import PROTOCOL_VERSION
from agents.rpc.protocol import STREAM_LIMIT, VERSION_MISMATCH, RpcError
from console.fleet import Node
from console.linkstate import LinkState

HELLO_TIMEOUT_S = 20.0


class Unreachable(ConnectionError):
    """The node cannot be reached; the message says how it failed."""


class HostKeyProblem(Unreachable):
    def __init__(self, node: str, kind: str, fingerprint: str | None, known_hosts: str) -> None:
        self.kind = kind  # "unknown" or "changed"
        self.fingerprint = fingerprint
        self.known_hosts = known_hosts
        if kind == "changed":
            msg = (f"{node}: the host key CHANGED (now {fingerprint}); refusing to connect. "
                   f"If the node was rebuilt, remove its old line from {known_hosts}")
        else:
            msg = (f"{node}: unknown host key {fingerprint}; accept it in the console or pass "
                   "--accept-new-host-key")
        super().__init__(msg)


class VersionMismatch(Unreachable):
    pass


def known_hosts_path(node: Node) -> str:
    return os.path.expanduser(node.known_hosts or "~/.ssh/known_hosts")


def _ssh_options(node: Node) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "known_hosts": known_hosts_path(node),
        "connect_timeout": node.connect_timeout_s,
        "keepalive_interval": node.keepalive_s,
        "keepalive_count_max": 3,
    }
    if node.port:
        opts["port"] = node.port
    if node.user:
        opts["username"] = node.user
    if node.identity_file:
        opts["client_keys"] = [os.path.expanduser(node.identity_file)]
    return opts


async def _host_key_problem(node: Node) -> HostKeyProblem:
    path = known_hosts_path(node)
    port = node.port or 22
    kind = "unknown"
    try:
        known = asyncssh.read_known_hosts(path)
        if known.match(node.host or "", "", port)[0]:
            kind = "changed"
    except (OSError, ValueError):
        pass
    fingerprint = None
    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(node.host or "", port),
                                     node.connect_timeout_s)
        fingerprint = key.get_fingerprint() if key is not None else None
    except (OSError, asyncssh.Error, TimeoutError):
        pass
    return HostKeyProblem(node.name, kind, fingerprint, path)


async def accept_host_key(node: Node) -> str:
    """Trust the node's current host key: append it to known_hosts. Returns the fingerprint."""
    port = node.port or 22
    key = await asyncio.wait_for(asyncssh.get_server_host_key(node.host or "", port),
                                 node.connect_timeout_s)
    if key is None:
        raise Unreachable(f"{node.name}: the server sent no host key")
    host = node.host if port == 22 else f"[{node.host}]:{port}"
    path = Path(known_hosts_path(node))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(f"{host} {key.export_public_key().decode().strip()}\n")
    return str(key.get_fingerprint())


async def ssh_connect(node: Node, ciphers: list[str] | None = None
                      ) -> asyncssh.SSHClientConnection:
    """An SSH connection to the node, or Unreachable naming why not. `ciphers` puts preferred
    ones first (bulk copies want AES-GCM)."""
    opts = _ssh_options(node)
    if ciphers:
        opts["encryption_algs"] = ciphers
    if not os.path.exists(opts["known_hosts"]):
        # No known_hosts file at all (a fresh laptop): every host is unknown, and accepting
        # one creates the file. A host that does not answer is unreachable, not unknown.
        problem = await _host_key_problem(node)
        if problem.fingerprint is None:
            raise Unreachable(f"{node.name}: no SSH answer from {node.host}:{node.port or 22}")
        raise problem
    try:
        return await asyncssh.connect(node.host or "", **opts)
    except asyncssh.HostKeyNotVerifiable:
        raise await _host_key_problem(node) from None
    except asyncssh.PermissionDenied as exc:
        raise Unreachable(f"{node.name}: SSH refused our key ({exc.reason})") from None
    except TimeoutError:
        raise Unreachable(f"{node.name}: no SSH answer from {node.host}:{node.port or 22} "
                          f"within {node.connect_timeout_s:.0f} s") from None
    except ConnectionRefusedError:
        raise Unreachable(f"{node.name}: connection refused by {node.host}:"
                          f"{node.port or 22}") from None
    except (OSError, asyncssh.Error) as exc:
        raise Unreachable(f"{node.name}: {type(exc).__name__}: {exc}") from None


def agent_command(node: Node, *args: str) -> str:
    return " ".join([node.agent, *(shlex.quote(a) for a in args)])


@dataclass
class Pipe:
    """Either side of an agent channel: lines in, lines out."""

    reader: Any
    writer: Any
    close: Callable[[], Any]


async def open_pipe(node: Node, conn: asyncssh.SSHClientConnection | None) -> Pipe:
    if node.local:
        cmd = shlex.split(os.path.expanduser(node.agent)) if node.agent else \
            [sys.executable, "-m", "agents.cli"]
        proc = await asyncio.create_subprocess_exec(
            *cmd, "serve", node.run_dir, "--stdio", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=STREAM_LIMIT)

        async def close_local() -> None:
            if proc.stdin is not None:
                proc.stdin.close()
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

        return Pipe(proc.stdout, proc.stdin, close_local)
    assert conn is not None
    process = await conn.create_process(agent_command(node, "serve", node.run_dir, "--stdio"),
                                        encoding=None)
    return Pipe(process.stdout, process.stdin, process.close)


class AgentLink:
    """One node's channel: calls with replies, pushed snapshots, reconnection."""

    def __init__(self, node: Node, on_snapshot: Callable[[str, dict[str, Any]], None] | None = None,
                 on_state: Callable[[str, LinkState, str | None], None] | None = None,
                 ciphers: list[str] | None = None) -> None:
        self.node = node
        self.ciphers = ciphers
        self.on_snapshot = on_snapshot
        self.on_state = on_state
        self.state: LinkState = "connecting"
        self.error: str | None = None
        self.conn: asyncssh.SSHClientConnection | None = None
        self.hello: dict[str, Any] | None = None
        self.last_contact: float | None = None
        self.host_key_problem: HostKeyProblem | None = None  # the TUI asks about unknown keys
        self._pipe: Pipe | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self._lost = asyncio.Event()

    def _set(self, state: LinkState, error: str | None = None) -> None:
        self.state, self.error = state, error
        if self.on_state is not None:
            self.on_state(self.node.name, state, error)

    async def connect(self) -> dict[str, Any]:
        """Open the channel and say hello; raises Unreachable / VersionMismatch."""
        if not self.node.local:
            self.conn = await ssh_connect(self.node, self.ciphers)
        try:
            self._pipe = await open_pipe(self.node, self.conn)
        except (OSError, asyncssh.Error) as exc:
            await self.close_channel()
            raise Unreachable(f"{self.node.name}: cannot start the agent "
                              f"({self.node.agent}): {exc}") from None
        self._lost.clear()
        self._reader = asyncio.create_task(self._read_loop())
        try:
            self.hello = await self.call("hello", {"protocol": PROTOCOL_VERSION},
                                         timeout=HELLO_TIMEOUT_S)
        except RpcError as exc:
            await self.close_channel()
            if exc.code == VERSION_MISMATCH:
                raise VersionMismatch(f"{self.node.name}: {exc.message}") from None
            raise Unreachable(f"{self.node.name}: hello refused: {exc.message}") from None
        except (ConnectionError, TimeoutError) as exc:
            await self.close_channel()
            raise Unreachable(f"{self.node.name}: the agent did not answer hello "
                              f"({self.node.agent}): {exc or type(exc).__name__}") from None
        self.last_contact = time.time()
        self._set("connected")
        return self.hello

    async def _read_loop(self) -> None:
        assert self._pipe is not None
        try:
            while True:
                line = await self._pipe.reader.readline()
                if not line:
                    break
                self.last_contact = time.time()
                try:
                    msg = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    continue
                rid = msg.get("id")
                if rid is not None:
                    fut = self._pending.pop(rid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                elif msg.get("method") == "status" and self.on_snapshot is not None:
                    self.on_snapshot(self.node.name, msg.get("params") or {})
        except (OSError, asyncssh.Error, ValueError):
            pass
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(f"{self.node.name}: connection lost"))
            self._pending.clear()
            self._lost.set()

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float = 60.0) -> Any:
        if self._pipe is None or self._lost.is_set():
            raise ConnectionError(f"{self.node.name}: not connected")
        self._next += 1
        rid = self._next
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        line = msgspec.json.encode({"jsonrpc": "2.0", "id": rid, "method": method,
                                    "params": params or {}}) + b"\n"
        self._pipe.writer.write(line)
        await self._pipe.writer.drain()
        try:
            msg = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._pending.pop(rid, None)
            raise TimeoutError(f"{self.node.name}: no answer to {method} within "
                               f"{timeout:.0f} s") from None
        if "error" in msg:
            err = msg["error"]
            raise RpcError(err.get("code", -32603), err.get("message", "?"), err.get("data"))
        return msg.get("result")

    async def close_channel(self) -> None:
        if self._pipe is not None:
            try:
                closing = self._pipe.close()
                if inspect.isawaitable(closing):
                    await closing
            except (OSError, asyncssh.Error):
                pass
            self._pipe = None
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    async def run(self, subscribe: bool = True, max_backoff_s: float = 30.0) -> None:
        """Stay connected: connect, subscribe, wait for a drop, reconnect with backoff."""
        delay = 1.0
        while not self._closed:
            try:
                await self.connect()
                if subscribe:
                    snap = await self.call("subscribe", {}, timeout=30)
                    if self.on_snapshot is not None and isinstance(snap, dict):
                        self.on_snapshot(self.node.name, snap)
                delay = 1.0
                await self._lost.wait()
                if self._closed:
                    break
                self._set("reconnecting", "connection lost")
            except HostKeyProblem as exc:
                self.host_key_problem = exc
                self._set("host key", str(exc))
            except VersionMismatch as exc:
                self._set("version mismatch", str(exc))
            except (Unreachable, ConnectionError, TimeoutError, RpcError) as exc:
                self._set("reconnecting" if self.last_contact else "unreachable", str(exc))
            await self.close_channel()
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff_s)

    async def close(self) -> None:
        self._closed = True
        self._lost.set()
        await self.close_channel()
