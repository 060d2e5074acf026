"""Where a run's control socket lives. sun_path holds 107 bytes, and run directories can be
deep, so the socket sits in a short per-user folder (/tmp/fleetdeck-UID) and
RUN_DIR/agent.sock.path points to it.

/tmp is shared by every user: the folder is created 0700 and then checked with lstat (a
directory, not a symlink, ours, no access for group or others); anything else is refused with
a message naming it, never used. Sockets left by supervisors that died (kill -9) are removed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import stat
from pathlib import Path


class SocketDirError(RuntimeError):
    """The socket folder cannot be trusted; the message names it and says what to do."""


def socket_folder() -> Path:
    # FLEETDECK_SOCKET_DIR: another folder (tests; a host whose /tmp is unusable).
    override = os.environ.get("FLEETDECK_SOCKET_DIR")
    return Path(override) if override else Path(f"/tmp/fleetdeck-{os.getuid()}")


def checked_folder() -> Path:
    """The socket folder, created 0700 if missing; SocketDirError if it is not a directory
    of ours that only we can enter."""
    folder = socket_folder()
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SocketDirError(f"{folder}: cannot create the socket folder: {exc.strerror}") \
            from None
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise SocketDirError(f"{folder}: cannot check the socket folder: {exc.strerror}") \
            from None
    fix = ("remove it (or have its owner remove it) and try again, or set "
           "FLEETDECK_SOCKET_DIR to a folder of your own")
    if stat.S_ISLNK(st.st_mode):
        raise SocketDirError(f"{folder}: the socket folder is a symbolic link, not a folder; "
                             f"refused: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(f"{folder}: the socket folder is not a folder; refused: {fix}")
    if st.st_uid != os.getuid():
        raise SocketDirError(f"{folder}: the socket folder belongs to uid {st.st_uid}, not to "
                             f"this account (uid {os.getuid()}); refused: {fix}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SocketDirError(f"{folder}: the socket folder has mode {mode:04o}, open to other "
                             f"users (it must be 0700); refused: {fix} (or chmod 700 it if you "
                             "made it)")
    return folder


def socket_path(run_dir: Path) -> Path:
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return checked_folder() / f"{digest}.sock"


def remove_stale_sockets(folder: Path, keep: Path | None = None) -> list[Path]:
    """Remove the sockets in `folder` that nothing listens on any more (their supervisor
    died without cleaning up). Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        path = Path(entry.path)
        if not entry.name.endswith(".sock") or path == keep:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            continue
        if _stale(path):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def _stale(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError as exc:
            return exc.errno in (errno.ECONNREFUSED, errno.ENOENT)
        return False


def recorded_socket(run_dir: Path) -> Path | None:
    """The socket RUN_DIR/agent.sock.path names, when it is a socket of ours in our checked
    socket folder; None otherwise (a run directory may not point us elsewhere)."""
    try:
        text = (run_dir / "agent.sock.path").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = Path(text)
    try:
        if path.parent != checked_folder():
            return None
        st = os.lstat(path)
    except (SocketDirError, OSError):
        return None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        return None
    return path
