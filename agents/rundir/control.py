"""control.json: desired live settings. Written under the control lock with `rev` increased;
read by the engine. Every change is also appended to control.log.jsonl (the audit trail).
Both are durable when a call returns: control.json by an fsynced replace, the audit record by
an fsynced append (and their folder fsynced), so a power loss never undoes an answered change."""

from __future__ import annotations

import fcntl
import os
import pwd
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.atomic import append_durably, atomic_write
from agents.rundir.schema import Concurrency, Control, control_decoder, encoder
from agents.rundir.spec import AUTO_START


class ControlError(ValueError):
    pass


def control_path(run_dir: Path) -> Path:
    return run_dir / "control.json"


def read_control(run_dir: Path) -> Control | None:
    path = control_path(run_dir)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a folder, unreadable: named, never a traceback
        raise ControlError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return control_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ControlError(f"{path}: {exc}") from None


AUTO = "auto"  # what `resize` takes, beside a number, to hand a server to the auto-tuner
AUTO_WHO = "auto"  # the audit trail's `who` for the tuner's own changes


def initial_control(concurrency: int | str, max_tokens: int) -> Control:
    if concurrency == AUTO:
        return Control(rev=1, concurrency=Concurrency(default=AUTO_START, auto=True),
                       max_tokens=max_tokens)
    assert isinstance(concurrency, int)
    return Control(rev=1, concurrency=Concurrency(default=concurrency), max_tokens=max_tokens)


def parse_resize_value(value: object) -> int | str:
    """`resize`'s VALUE: a whole number >= 0 or "auto"; ControlError naming it otherwise."""
    if value == AUTO:
        return AUTO
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ControlError(f"resize: VALUE must be a whole number >= 0 or \"auto\", got {value!r}")


def resize(c: Control, value: int | str, server: int | None) -> None:
    """The one meaning of `resize` (CLI and RPC alike): a number sets the level by hand and
    takes the server (or all) away from the tuner; "auto" hands it (or all) to the tuner,
    which starts from the level it has now."""
    conc = c.concurrency
    if value == AUTO:
        if server is None:
            conc.auto = True
            conc.auto_servers.clear()
        else:
            conc.auto_servers[str(server)] = True
        return
    assert isinstance(value, int)
    if server is None:
        conc.default = value
        conc.servers.clear()
        conc.auto = False
        conc.auto_servers.clear()
    else:
        conc.servers[str(server)] = value
        conc.auto_servers[str(server)] = False


def resize_refusal(run_dir: Path, value: int | str, server: int | None) -> str | None:
    """Why this run cannot take this `resize`, or None. Behind SGLang's router
    (`[servers] router = true`) the engine has one server, the router, whose concurrency is
    the router's as a whole: a level for one server, or "auto" (which tunes each server on
    its own), has nothing to apply to."""
    from agents.rundir.spec import SpecError, load_run_spec

    try:
        router = load_run_spec(run_dir).servers.router
    except SpecError:
        return None  # not this check's to report: update_control names a missing run
    if not router:
        return None
    if server is not None:
        return (f"{run_dir}: the run sends through SGLang's router ([servers] router = true): "
                "concurrency is the router's as a whole; resize VALUE without --server")
    if value == AUTO:
        return (f"{run_dir}: the run sends through SGLang's router ([servers] router = true): "
                "auto tunes each server on its own and there is one, the router; give a number")
    return None


@contextmanager
def control_lock(run_dir: Path) -> Iterator[None]:
    fd = os.open(run_dir / "control.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def who() -> str:
    """The person behind a control call, as the node knows it: this account and the SSH
    client's address (SSH_CONNECTION, set by sshd) when known, else this host."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name  # the account, not an environment variable
    except KeyError:
        user = str(os.getuid())
    conn = os.environ.get("SSH_CONNECTION") or os.environ.get("SSH_CLIENT") or ""
    client = conn.split(" ")[0]
    return f"{user}@{client}" if client else f"{user}@{socket.gethostname()}"


def audit(run_dir: Path, method: str, params: dict[str, Any], by: str | None = None,
          result: str = "ok") -> None:
    rec = {"time": time.time(), "method": method, "params": params, "who": by or who(),
           "result": result}
    append_durably(run_dir / "control.log.jsonl", encoder.encode(rec) + b"\n")


def update_control(run_dir: Path, method: str, params: dict[str, Any],
                   change: Callable[[Control], None], by: str | None = None) -> Control:
    """Read-modify-write control.json under the lock, rev + 1, then audit."""
    if not run_dir.is_dir():
        raise ControlError(f"{run_dir}: not a run directory")
    with control_lock(run_dir):
        current = read_control(run_dir)
        if current is None:
            raise ControlError(f"{control_path(run_dir)}: missing (was the run ever started?)")
        change(current)
        current.rev += 1
        atomic_write(control_path(run_dir), encoder.encode(current))
    audit(run_dir, method, params, by)
    return current


def set_auto_level(run_dir: Path, server: int, level: int, why: str) -> Control | None:
    """The tuner's change of one server's level: written (rev + 1, audited with who = auto)
    only while that server is still auto-tuned and the level differs; None otherwise, so a
    manual resize that landed a moment before always wins."""
    with control_lock(run_dir):
        current = read_control(run_dir)
        if current is None or not current.concurrency.auto_for(server) or \
                current.concurrency.for_server(server) == level:
            return None
        current.concurrency.servers[str(server)] = level
        current.rev += 1
        atomic_write(control_path(run_dir), encoder.encode(current))
    audit(run_dir, "resize", {"value": level, "server": server, "why": why}, AUTO_WHO)
    return current


def ensure_control(run_dir: Path, concurrency: int | str, max_tokens: int) -> Control:
    """First launch writes run.toml's values; on resume the last control.json wins."""
    with control_lock(run_dir):
        current = read_control(run_dir)
        if current is None:
            current = initial_control(concurrency, max_tokens)
            atomic_write(control_path(run_dir), encoder.encode(current))
    return current
