"""JSON-RPC 2.0 over newline-delimited JSON: framing, errors, and the method table.

Used on the supervisor's Unix socket and on `fleetdeck-agent serve --stdio` alike. Lines may be
large (history, manifest): readers set their stream limit explicitly (asyncio's default is
64 KiB).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

STREAM_LIMIT = 64 * 1024 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Application errors.
NOT_RUNNING = -32001
REFUSED = -32002
VERSION_MISMATCH = -32003
# The supervisor exited with the request in hand: it may or may not have been done.
NO_ANSWER = -32004

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def encode(obj: Any) -> bytes:
    try:
        return msgspec.json.encode(obj) + b"\n"
    except UnicodeEncodeError:
        # A string JSON cannot hold: a name that is not UTF-8, as os gives it (surrogate
        # escapes). Sent with those bytes shown as \\xNN rather than not at all; names that must
        # survive whole travel as bytes (the manifest's path_b64).
        return msgspec.json.encode(_utf8_only(msgspec.to_builtins(obj))) + b"\n"


def _utf8_only(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(obj, dict):
        return {_utf8_only(k): _utf8_only(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_utf8_only(v) for v in obj]
    return obj


def error_reply(rid: Any, code: int, message: str, data: Any = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return encode({"jsonrpc": "2.0", "id": rid, "error": err})


def notification(method: str, params: Any) -> bytes:
    return encode({"jsonrpc": "2.0", "method": method, "params": params})


class RequestUnreadable(ValueError):
    """A request line that cannot be read: not JSON, or nested past MAX_DEPTH."""


# No request of ours nests deeper than a few levels; deeper is hostile (and would exhaust the
# decoder's recursion: a RecursionError, which once killed `serve --stdio`).
MAX_DEPTH = 64


def _too_deep(line: bytes, limit: int = MAX_DEPTH) -> bool:
    """Brackets nested past `limit` outside strings: a cheap scan before decoding."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def decode_request(line: bytes) -> Any:
    """One request line as JSON, or RequestUnreadable naming why not."""
    if _too_deep(line):
        raise RequestUnreadable(f"not accepted: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise RequestUnreadable(f"not JSON: {exc}") from None
    except RecursionError:
        raise RequestUnreadable("not accepted: JSON nested too deep") from None


async def dispatch_line(line: bytes, methods: dict[str, Handler]) -> bytes | None:
    """Answer one request line; None for a notification (no id). Never raises."""
    try:
        req = decode_request(line)
    except RequestUnreadable as exc:
        return error_reply(None, PARSE_ERROR, str(exc))
    if not isinstance(req, dict) or req.get("jsonrpc") != "2.0" or \
            not isinstance(req.get("method"), str):
        return error_reply(req.get("id") if isinstance(req, dict) else None, INVALID_REQUEST,
                           "expected {jsonrpc: '2.0', method: str, params?, id?}")
    rid = req.get("id")
    params = req.get("params") or {}
    if not isinstance(params, dict):
        return error_reply(rid, INVALID_PARAMS, "params must be an object")
    handler = methods.get(req["method"])
    if handler is None:
        return error_reply(rid, METHOD_NOT_FOUND, f"unknown method {req['method']!r}")
    try:
        result = await handler(params)
    except RpcError as exc:
        return error_reply(rid, exc.code, exc.message, exc.data)
    except (KeyError, TypeError, ValueError) as exc:
        return error_reply(rid, INVALID_PARAMS, f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return error_reply(rid, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
    if rid is None:
        return None
    return encode({"jsonrpc": "2.0", "id": rid, "result": result})


class RpcClient:
    """A client over any (reader, writer) pair: the Unix socket, or SSH channel streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._next = 0

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float = 30.0) -> Any:
        self._next += 1
        rid = self._next
        self.writer.write(encode({"jsonrpc": "2.0", "id": rid, "method": method,
                                  "params": params or {}}))
        await self.writer.drain()
        while True:
            line = await asyncio.wait_for(self.reader.readline(), timeout)
            if not line:
                raise ConnectionError("the agent closed the connection")
            msg = msgspec.json.decode(line)
            if msg.get("id") != rid:
                continue  # a pushed notification
            if "error" in msg:
                err = msg["error"]
                raise RpcError(err.get("code", INTERNAL_ERROR), err.get("message", "?"),
                               err.get("data"))
            return msg.get("result")

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, BrokenPipeError):
            pass
