"""`fleetdeck-agent send-files RUN_DIR`: the run's files as one framed stream on stdout, for
`fleetdeck pull`'s streamed data path (console/artifacts/streamed.py).

The console runs this through OpenSSH's `ssh` (C, AES-GCM), as rsync runs its remote half: no
SFTP request per 255 KiB, and the bytes go from the page cache into the pipe by sendfile(2).

Protocol. stdin: one JSON object per line, `{"path": REL, "offset": N, "length": N}` (a
name that is not UTF-8 as `"raw": base64` instead of `path`, as the manifest gives it), ended
by EOF. stdout: the line `MAGIC`, then for each request in order one JSON header line
`{"i": I, "n": N}` followed by exactly N bytes of the file from `offset` (N < length when the
file is shorter now), or `{"i": I, "n": 0, "error": "..."}`. Only what the manifest would list
is served: a path with a symlink on the way, a file that is not regular, the secrets file, the
supervisor's runtime files and temporary names are refused, per file, with the reason.
"""

from __future__ import annotations

import base64
import io
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from agents.artifacts.manifest import RUNTIME_FILES, open_confined, request_path, skipped
from agents.rundir.browse import OutsideRunDir
from agents.rundir.secrets import SECRETS_NAME

MAGIC = b"FLEETDECK-SEND 1\n"
# A request line longer than this is refused (a path is at most 4 KiB on Linux).
MAX_REQUEST = 16 * 1024
SENDFILE_CHUNK = 8 * 1024 * 1024
# Files up to SMALL bytes are read and gathered with their headers into writes of GATHER
# bytes; bigger ones go by sendfile(2).
SMALL = 256 * 1024
GATHER = 1024 * 1024
READ = 64 * 1024


class SendError(Exception):
    pass


def _request(line: bytes, number: int) -> tuple[str, int, int]:
    """(rel, offset, length) of one request line; SendError naming the line otherwise."""
    try:
        req: Any = json.loads(line)
        if not isinstance(req, dict):
            raise ValueError("not an object")
        if "raw" in req:
            rel = os.fsdecode(base64.b64decode(req["raw"], validate=True))
        else:
            rel = req["path"]
        offset, length = req["offset"], req["length"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SendError(f"request line {number}: {exc}") from None
    if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0
            and length >= 0) or isinstance(offset, bool) or isinstance(length, bool):
        raise SendError(f"request line {number}: offset and length must be whole numbers "
                        ">= 0")
    return rel, offset, length


def _refused(rel: str) -> str | None:
    """Why the manifest would not list this path, or None."""
    parts = rel.split("/")
    if any(skipped(p) for p in parts):
        return "a temporary or cache file: not an artifact"
    if len(parts) == 1 and (rel == SECRETS_NAME or rel in RUNTIME_FILES):
        return "not an artifact of the run (never pulled)"
    return None


class _Out:
    """stdout with small writes gathered: a thousand small files go as a few large writes (a
    few SSH packets), not two small ones each (a header, then the bytes)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def write(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) >= GATHER:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            _write_all(self.fd, bytes(self.buf))
            self.buf.clear()


def _send_one(out: _Out, run_dir: Path, i: int, rel: str, offset: int, length: int) -> int:
    """Write one file's header and bytes; returns the byte count sent."""
    try:
        rel = request_path(run_dir, rel, "path")
        why = _refused(rel) if rel else "the run directory itself is not a file"
        if why is not None:
            raise OutsideRunDir(f"{rel}: {why}")
        fd = open_confined(run_dir, rel)
    except (OutsideRunDir, OSError) as exc:
        out.write(_header(i, n=0, error=str(exc)))
        return 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            out.write(_header(i, n=0, error=f"{rel}: not a regular file"))
            return 0
        n = max(0, min(length, st.st_size - offset))
        out.write(_header(i, n=n))
        if n <= SMALL:
            data = _pread_all(fd, n, offset)
            # The file shrank since fstat: the frame must still be whole, so pad with
            # zeros; the console's sha256 check refuses it.
            out.write(data + bytes(n - len(data)))
            return n
        out.flush()
        sent = 0
        while sent < n:
            try:
                k = os.sendfile(out.fd, fd, offset + sent, min(SENDFILE_CHUNK, n - sent))
            except OSError:
                k = 0
            if k == 0:
                # As above: shrank (or sendfile cannot serve it): zeros, refused there.
                _write_all(out.fd, bytes(min(SENDFILE_CHUNK, n - sent)))
                k = min(SENDFILE_CHUNK, n - sent)
            sent += k
        return sent
    finally:
        os.close(fd)


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    parts = []
    got = 0
    while got < n:
        try:
            chunk = os.pread(fd, n - got, offset + got)
        except OSError:
            break
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _header(i: int, n: int, error: str | None = None) -> bytes:
    head: dict[str, Any] = {"i": i, "n": n}
    if error is not None:
        head["error"] = error
    return json.dumps(head).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        k = os.write(fd, view)
        view = view[k:]


def serve(run_dir: Path, stdin: BinaryIO, out_fd: int) -> int:
    """Answer every request on stdin in order; returns the exit status (2: a bad request,
    after the files before it were sent)."""
    out = _Out(out_fd)
    out.write(MAGIC)
    out.flush()
    try:
        return _serve(run_dir.resolve(), stdin, out)
    finally:
        out.flush()  # what was gathered goes, also before a bad request's exit


def _serve(run_dir: Path, stdin: BinaryIO, out: _Out) -> int:
    requests = _Requests(stdin, before_wait=out.flush)
    number = index = 0
    while True:
        line = requests.readline(MAX_REQUEST + 1)
        if not line:
            return 0
        number += 1
        if len(line) > MAX_REQUEST:
            print(f"send-files: request line {number} is longer than {MAX_REQUEST} bytes",
                  file=sys.stderr)
            return 2
        if not line.strip():
            continue
        try:
            rel, offset, length = _request(line, number)
        except SendError as exc:
            print(f"send-files: {exc}", file=sys.stderr)
            return 2
        _send_one(out, run_dir, index, rel, offset, length)
        index += 1


class _Requests:
    """The request lines, read here from stdin's descriptor: before a read that may wait for
    the console, `before_wait` runs (what is gathered goes out first, so the console is never
    kept waiting for bytes that sit here while this waits for it)."""

    def __init__(self, stdin: BinaryIO, before_wait: Callable[[], None]) -> None:
        try:
            self.fd: int | None = stdin.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.fd = None  # an in-memory stream (tests): it never waits
        self.stdin = stdin
        self.before_wait = before_wait
        self.buf = bytearray()
        self.eof = False

    def readline(self, limit: int) -> bytes:
        """The next line with its newline, at most `limit` bytes (a longer one is cut there);
        the last bytes without one at EOF; b"" after."""
        while True:
            nl = self.buf.find(b"\n", 0, limit)
            if nl >= 0 or len(self.buf) >= limit or self.eof:
                end = nl + 1 if nl >= 0 else min(limit, len(self.buf))
                line = bytes(self.buf[:end])
                del self.buf[:end]
                return line
            self.before_wait()
            chunk = os.read(self.fd, READ) if self.fd is not None else self.stdin.read(READ)
            if not chunk:
                self.eof = True
            self.buf += chunk
