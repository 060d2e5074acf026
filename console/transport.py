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
from console.sanitize import shown

# The agent's hello comes once its Python has started on the node: seconds on an idle one,
# far longer on a node whose CPUs are saturated (tokenizers, data loaders, a busy login
# node). A hung agent is named after this; a dead one closes the channel at once.
HELLO_TIMEOUT_S = 60.0


class Unreachable(ConnectionError):
    """The node cannot be reached; the message says how it failed."""


class HostKeyProblem(Unreachable):
    """The node's host key is not trusted: "unknown" (recorded under neither its name nor its
    address) or "changed" (a different key is recorded under one of them). `key` is the key
    the server showed on this very connection: the one accepting it saves."""

    def __init__(self, node: str, kind: str, fingerprint: str | None, known_hosts: str,
                 key: asyncssh.SSHKey | None = None, address: str | None = None) -> None:
        self.kind = kind  # "unknown" or "changed"
        self.fingerprint = fingerprint
        self.known_hosts = known_hosts
        self.key = key
        self.address = address  # the server's IP address, as the connection saw it
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


def known_name(host: str, port: int) -> str:
    """How known_hosts names a host: `host` on port 22, else `[host]:port` (OpenSSH's form;
    a key recorded for port 22 says nothing about another port)."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass
class _Recorded:
    """What known_hosts says of one name: host keys, CA keys, revoked keys."""

    keys: list[asyncssh.SSHKey]
    ca_keys: list[asyncssh.SSHKey]
    revoked: list[asyncssh.SSHKey]


def _recorded(path: str, name: str) -> _Recorded:
    """The keys known_hosts records under exactly `name` (no fallback to another port)."""
    try:
        known = asyncssh.read_known_hosts(path)
    except FileNotFoundError:
        return _Recorded([], [], [])
    found = known.match(name, "", None)
    return _Recorded(list(found[0]), list(found[1]), list(found[2]))


class _HostKeyCheck(asyncssh.SSHClient):
    """Host keys checked as OpenSSH does with CheckHostIP: a key must be recorded under the
    node's name, and whatever is recorded under its address must agree. Keeps the key the
    server showed (and its address) when that key is not trusted."""

    def __init__(self, node: Node, path: str) -> None:
        self.node = node
        self.path = path
        self.by_name = _Recorded([], [], [])
        self.by_address = _Recorded([], [], [])
        self.shown: asyncssh.SSHKey | None = None
        self.address: str | None = None

    def trusted(self, host: str, addr: str, port: int | None
                ) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]:
        """asyncssh's known_hosts callback: (trusted keys, CA keys, revoked keys)."""
        port = port or 22
        self.address = addr or None
        self.by_name = _recorded(self.path, known_name(self.node.host or host, port))
        if addr and addr != (self.node.host or host):
            self.by_address = _recorded(self.path, known_name(addr, port))
        keys = self.by_name.keys
        if self.by_address.keys:
            keys = [k for k in keys if k in self.by_address.keys]
        return (keys, self.by_name.ca_keys,
                self.by_name.revoked + self.by_address.revoked)

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        self.shown, self.address = key, addr or self.address
        return False

    def problem(self) -> HostKeyProblem:
        key = self.shown
        # Unknown only when nothing is recorded under the name and the address holds no
        # other key; any disagreement is a changed key (and so is a key not even shown to
        # us: a revoked one, a certificate that failed).
        changed = key is None or bool(self.by_name.keys) or \
            any(k != key for k in self.by_address.keys)
        return HostKeyProblem(self.node.name, "changed" if changed else "unknown",
                              key.get_fingerprint() if key is not None else None, self.path,
                              key, self.address)


async def accept_host_key(node: Node, problem: HostKeyProblem) -> str:
    """Trust the key the user was shown (`problem.key`, from the connection that asked):
    append it to known_hosts under the node's name and address, in OpenSSH's format. Never a
    changed key, and never a key fetched again. Returns its fingerprint."""
    if problem.kind != "unknown" or problem.key is None:
        raise problem
    port = node.port or 22
    names = [known_name(node.host or "", port)]
    if problem.address and problem.address != node.host:
        names.append(known_name(problem.address, port))
    path = Path(known_hosts_path(node))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{','.join(names)} {problem.key.export_public_key().decode().strip()}\n"
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line  # the last line stays whole
        f.write(line.encode())
    return str(problem.key.get_fingerprint())


async def ssh_connect(node: Node, ciphers: list[str] | None = None
                      ) -> asyncssh.SSHClientConnection:
    """An SSH connection to the node, or Unreachable naming why not. `ciphers` puts preferred
    ones first (bulk copies want AES-GCM). The host key is checked by name and by address
    (`_HostKeyCheck`); an untrusted one raises HostKeyProblem holding the key shown."""
    opts = _ssh_options(node)
    if ciphers:
        opts["encryption_algs"] = ciphers
    path = opts["known_hosts"]
    # No known_hosts file at all (a fresh laptop): every host is unknown, and accepting one
    # creates the file. A host that does not answer is unreachable, not unknown.
    fresh = not os.path.exists(path)
    check = _HostKeyCheck(node, path)
    opts["known_hosts"] = check.trusted
    try:
        conn, _ = await asyncssh.create_connection(lambda: check, node.host or "", **opts)
        return conn
    except asyncssh.HostKeyNotVerifiable:
        raise check.problem() from None
    except asyncssh.PermissionDenied as exc:
        raise Unreachable(f"{node.name}: SSH refused our key ({exc.reason})") from None
    except (OSError, asyncssh.Error) as exc:
        if fresh:
            raise Unreachable(f"{node.name}: no SSH answer from {node.host}:"
                              f"{node.port or 22}") from None
        if isinstance(exc, TimeoutError):
            raise Unreachable(f"{node.name}: no SSH answer from {node.host}:"
                              f"{node.port or 22} within {node.connect_timeout_s:.0f} s"
                              ) from None
        if isinstance(exc, ConnectionRefusedError):
            raise Unreachable(f"{node.name}: connection refused by {node.host}:"
                              f"{node.port or 22}") from None
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


class _Head(msgspec.Struct):
    """A JSON-RPC line as the read loop first looks at it: a status notification's params are
    kept as their bytes, unparsed."""

    method: Any = None
    id: Any = None
    params: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


_head_decoder = msgspec.json.Decoder(_Head)


def status_snapshot(line: bytes) -> bytes | None:
    """A status notification's snapshot as its JSON bytes (the console decodes them once,
    typed: console/state.py), or None for any other line, which is read the general way."""
    try:
        head = _head_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if head.method != "status" or head.id is not None:
        return None
    params = bytes(head.params)
    return b"{}" if params == b"null" else params  # as `params or {}` read it


class AgentLink:
    """One node's channel: calls with replies, pushed snapshots, reconnection. A pushed
    snapshot reaches on_snapshot as its JSON bytes; subscribe's answer, as a dict."""

    def __init__(self, node: Node,
                 on_snapshot: Callable[[str, dict[str, Any] | bytes], None] | None = None,
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
                if self.on_snapshot is not None and (snap := status_snapshot(line)) is not None:
                    self.on_snapshot(self.node.name, snap)
                    continue
                try:
                    msg = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    msg = None
                if not isinstance(msg, dict):
                    # The agent's stdout is the protocol: anything else (a banner, a stray
                    # print) means the calls waiting now will not be answered as asked. Say
                    # so at once, naming the line, rather than after each call's timeout.
                    self._fail_pending(f"{self.node.name}: the agent wrote a line that is not "
                                       f"JSON-RPC: {shown(line[:200].decode(errors='replace'))}")
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

    def _fail_pending(self, why: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(why))
        self._pending.clear()

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
