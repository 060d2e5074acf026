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
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO

from agents.artifacts.manifest import RUNTIME_FILES, open_confined, request_path, skipped
from agents.rundir.browse import OutsideRunDir
from agents.rundir.secrets import SECRETS_NAME

MAGIC = b"FLEETDECK-SEND 1\n"
# A request line longer than this is refused (a path is at most 4 KiB on Linux).
MAX_REQUEST = 16 * 1024
SENDFILE_CHUNK = 8 * 1024 * 1024


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


def _send_one(out_fd: int, run_dir: Path, i: int, rel: str, offset: int, length: int) -> int:
    """Write one file's header and bytes; returns the byte count sent."""
    try:
        rel = request_path(run_dir, rel, "path")
        why = _refused(rel) if rel else "the run directory itself is not a file"
        if why is not None:
            raise OutsideRunDir(f"{rel}: {why}")
        fd = open_confined(run_dir, rel)
    except (OutsideRunDir, OSError) as exc:
        _write_all(out_fd, _header(i, n=0, error=str(exc)))
        return 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _write_all(out_fd, _header(i, n=0, error=f"{rel}: not a regular file"))
            return 0
        n = max(0, min(length, st.st_size - offset))
        _write_all(out_fd, _header(i, n=n))
        sent = 0
        while sent < n:
            try:
                k = os.sendfile(out_fd, fd, offset + sent, min(SENDFILE_CHUNK, n - sent))
            except OSError:
                k = 0
            if k == 0:
                # The file shrank since fstat (or sendfile cannot serve it): the frame must
                # still be whole, so pad with zeros; the console's sha256 check refuses it.
                _write_all(out_fd, bytes(min(SENDFILE_CHUNK, n - sent)))
                k = min(SENDFILE_CHUNK, n - sent)
            sent += k
        return sent
    finally:
        os.close(fd)


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
    _write_all(out_fd, MAGIC)
    run_dir = run_dir.resolve()
    number = index = 0
    while True:
        line = stdin.readline(MAX_REQUEST + 1)
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
        _send_one(out_fd, run_dir, index, rel, offset, length)
        index += 1
