"""Secrets of a run spec: `[servers] api_key`, `admin_api_key`, the `[servers] env` values
whose name holds TOKEN, KEY, SECRET or PASSWORD or is listed in `[servers] secret_env`, and
`[alerts] webhook` (a Slack or ntfy URL is the key to post there).

They never reach a launch script, the run.toml copy kept in RUN_DIR, a log, control.log,
status, an RPC answer or the pull set. The copy is written without them; they are kept in
RUN_DIR/secrets.json (mode 0600, owner only), which `logs` cannot name, the manifest never
lists (so `pull` never copies it) and only the spec loader reads back, so that a `resume`
after kill -9 still has them. Server processes get secret env values in their environment,
never on a command line or in a file."""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agents.rundir.atomic import fsync_dir, replace_durably

SECRETS_NAME = "secrets.json"
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
SECRET_FIELDS = ("api_key", "admin_api_key")
ALERTS_WEBHOOK = "webhook"  # [alerts] webhook
# The public copy names what it lacks on this line (names only, never values), so a missing
# secrets.json is a clear error at load rather than a run that gets 401s.
MARKER = "# fleetdeck-secrets: "


class SecretsError(ValueError):
    pass


def is_secret_env(name: str, explicit: Iterable[str] = ()) -> bool:
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS) or name in set(explicit)


def secret_env_names(env: Mapping[str, str], explicit: Iterable[str] = ()) -> list[str]:
    listed = set(explicit)
    return sorted(k for k in env if is_secret_env(k, listed))


def split(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the spec without its secrets, the secrets) from a parsed run.toml."""
    public = copy.deepcopy(raw)
    ps = public.get("servers")
    if not isinstance(ps, dict):
        ps = {}
    found: dict[str, Any] = {}
    for key in SECRET_FIELDS:
        if key in ps:
            found[key] = ps.pop(key)
    env = ps.get("env")
    explicit = ps.get("secret_env")
    listed = [x for x in explicit if isinstance(x, str)] if isinstance(explicit, list) else []
    if isinstance(env, dict):
        names = secret_env_names({k: v for k, v in env.items() if isinstance(k, str)}, listed)
        if names:
            found["env"] = {k: env.pop(k) for k in names}
    out: dict[str, Any] = {"servers": found} if found else {}
    alerts = public.get("alerts")
    if isinstance(alerts, dict) and ALERTS_WEBHOOK in alerts:
        out["alerts"] = {ALERTS_WEBHOOK: alerts.pop(ALERTS_WEBHOOK)}
    return public, out


def names(secrets: Mapping[str, Any]) -> list[str]:
    """What the secrets are, for people: `api_key`, `env HF_TOKEN`; never their values."""
    servers = secrets.get("servers") or {}
    out = [k for k in SECRET_FIELDS if k in servers]
    out += [f"env {k}" for k in sorted(servers.get("env") or {})]
    if ALERTS_WEBHOOK in (secrets.get("alerts") or {}):
        out.append(f"alerts {ALERTS_WEBHOOK}")
    return out


def merge(raw: dict[str, Any], secrets: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed public copy with its secrets put back."""
    alerts = secrets.get("alerts")
    if isinstance(alerts, dict) and ALERTS_WEBHOOK in alerts:
        raw.setdefault("alerts", {})[ALERTS_WEBHOOK] = alerts[ALERTS_WEBHOOK]
    found = secrets.get("servers")
    if not isinstance(found, dict) or not found:
        return raw
    servers = raw.setdefault("servers", {})
    for key in SECRET_FIELDS:
        if key in found:
            servers[key] = found[key]
    if isinstance(found.get("env"), dict):
        servers.setdefault("env", {}).update(found["env"])
    return raw


def write(run_dir: Path, secrets: Mapping[str, Any]) -> None:
    """RUN_DIR/secrets.json, created 0600 and replaced atomically; removed when there are
    none (a relaunch without secrets leaves none behind)."""
    path = run_dir / SECRETS_NAME
    if not secrets:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        fsync_dir(run_dir)  # gone for good: a power loss must not bring old secrets back
        return
    tmp = run_dir / f".{SECRETS_NAME}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, json.dumps(secrets).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    replace_durably(tmp, path)


def read(run_dir: Path) -> dict[str, Any] | None:
    """RUN_DIR/secrets.json, or None when there is none. Refused (SecretsError) when it is a
    symlink, not a regular file, someone else's, or readable by others."""
    path = run_dir / SECRETS_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretsError(f"{path}: cannot read ({exc.strerror}; a symbolic link?)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretsError(f"{path}: not a regular file")
        if st.st_uid != os.getuid():
            raise SecretsError(f"{path}: owned by uid {st.st_uid}, not this account")
        if st.st_mode & 0o077:
            raise SecretsError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o}, readable by "
                               "others: make it 0600 (chmod 600) after checking who read it")
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    finally:
        os.close(fd)
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise SecretsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise SecretsError(f"{path}: not a JSON object")
    return obj


def marked(text: str) -> list[str]:
    """The secret names the public copy says it lacks."""
    for line in text.splitlines():
        if line.startswith(MARKER):
            return [x.strip() for x in line[len(MARKER):].split(",") if x.strip()]
    return []


# -- writing TOML (the public copy) ---------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else _string(key)


def quoted(s: str) -> str:
    """A string as a TOML/JSON-style quoted literal: control characters escaped, so a file
    name can never end a comment line."""
    return _string(s)


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def to_toml(raw: Mapping[str, Any], header: str = "") -> str:
    """A parsed TOML document written back (comments are not kept): scalars first, then one
    [table] per top-level table, nested tables inline."""
    lines = [header] if header else []
    tables = [(k, v) for k, v in raw.items() if isinstance(v, dict)]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    for key, table in tables:
        lines += ["", f"[{_key(key)}]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
