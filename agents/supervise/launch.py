"""Starting a supervisor and talking to it over its socket: what `up`, `resume`, `stop`,
`down`, `restart-server` and `serve --stdio` share."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents import PROTOCOL_VERSION
from agents.rpc.protocol import STREAM_LIMIT, RpcClient, RpcError
from agents.rpc.sockpath import SocketDirError, checked_folder, recorded_socket
from agents.rundir.atomic import make_dirs
from agents.rundir.control import audit
from agents.rundir.spec import RunSpec, SpecError, keep_copy, load_run_spec
from agents.supervise.snapshot import supervisor_pid


class RunCtlError(RuntimeError):
    pass


async def connect(run_dir: Path, timeout: float = 5.0) -> RpcClient | None:
    """A client on the run's supervisor socket, or None when no supervisor answers."""
    sock = recorded_socket(run_dir)
    if sock is None or not sock.exists() or supervisor_pid(run_dir) is None:
        return None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(sock), limit=STREAM_LIMIT), timeout)
    except (OSError, TimeoutError):
        return None
    client = RpcClient(reader, writer)
    try:
        await client.call("hello", {"protocol": PROTOCOL_VERSION}, timeout=timeout)
    except (OSError, TimeoutError, ConnectionError, RpcError):
        # RpcError: a supervisor of another protocol version (the agent was upgraded under a
        # live run): answer from the run directory rather than not at all.
        await client.close()
        return None
    return client


def spawn_supervisor(run_dir: Path, env: dict[str, str] | None = None,
                     down_after_job: bool = False) -> subprocess.Popen[bytes]:
    """Start `python -m agents.supervise.supervisor RUN_DIR` detached: its own session, output to
    logs/supervisor.log, so it outlives this SSH session and this console. `down_after_job`:
    it goes down (servers and itself) when the job ends, as `up --wait` wants."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    extra = ["--down-after-job"] if down_after_job else []
    with open(run_dir / "logs" / "supervisor.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agents.supervise.supervisor", str(run_dir), *extra],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=run_dir, env={**os.environ, **(env or {})},
        )


async def wait_for_supervisor(run_dir: Path, proc: subprocess.Popen[bytes],
                              timeout: float = 60.0) -> RpcClient:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (run_dir / "logs" / "supervisor.log").read_text(errors="replace")[-2000:]
            raise RunCtlError(f"the supervisor exited with {proc.returncode}:\n{tail}")
        client = await connect(run_dir, timeout=2.0)
        if client is not None:
            return client
        await asyncio.sleep(0.1)
    raise RunCtlError(f"no supervisor answered for {run_dir} within {timeout:.0f} s")


async def up(spec: RunSpec, who: str | None = None) -> dict[str, Any]:
    """Create RUN_DIR and start its supervisor (servers, job). Refuses a live run."""
    await prepare_up(spec, who)
    proc = spawn_supervisor(spec.run_dir)
    client = await wait_for_supervisor(spec.run_dir, proc)
    await client.close()
    return {"run_dir": str(spec.run_dir), "supervisor_pid": proc.pid}


async def prepare_up(spec: RunSpec, who: str | None = None) -> None:
    """What `up` does before the supervisor starts: the checks, RUN_DIR, the spec's copy and
    the audit record. Refuses a live run."""
    _check_socket_folder()
    await _check_router(spec)
    run_dir = spec.run_dir
    make_dirs(run_dir)  # a power loss must not take the run's folder with it
    if supervisor_pid(run_dir) is not None:
        raise RunCtlError(f"{run_dir}: a supervisor already runs this run (pid "
                          f"{supervisor_pid(run_dir)}); use resume or stop")
    keep_copy(spec, run_dir)
    audit(run_dir, "launch", {"spec": spec.source}, who)


async def resume(run_dir: Path, who: str | None = None) -> dict[str, Any]:
    """Continue a run: through the live supervisor, or by starting a new one (which adopts
    the servers that are still there)."""
    client = await connect(run_dir)
    if client is not None:
        try:
            result: dict[str, Any] = await client.call("resume", {"who": who})
        finally:
            await client.close()
        return result
    if not (run_dir / "run.toml").exists():
        raise RunCtlError(f"{run_dir}: no run.toml; not a run directory")
    try:
        spec = load_run_spec(run_dir)  # its secrets too: refused here, not in a supervisor's log
    except SpecError as exc:
        raise RunCtlError(str(exc)) from None
    _check_socket_folder()
    await _check_router(spec)
    audit(run_dir, "resume", {"supervisor": "new"}, who)
    proc = spawn_supervisor(run_dir)
    client = await wait_for_supervisor(run_dir, proc)
    await client.close()
    return {"status": "started", "supervisor_pid": proc.pid}


async def _check_router(spec: RunSpec) -> None:
    """`router = true`: the URL must be SGLang's router, checked before anything starts."""
    if spec.servers.router and spec.servers.urls:
        from agents.engine.router import RouterError, check_router  # httpx: only when needed

        try:
            await asyncio.to_thread(check_router, spec.servers.urls[0], spec.servers.api_key,
                                    where=f"{spec.source}: [servers] urls[0]")
        except RouterError as exc:
            raise RunCtlError(str(exc)) from None


def _check_socket_folder() -> None:
    """Refuse to start a supervisor that could not listen safely (before anything is written)."""
    try:
        checked_folder()
    except SocketDirError as exc:
        raise RunCtlError(str(exc)) from None


async def call(run_dir: Path, method: str, params: dict[str, Any]) -> Any:
    client = await connect(run_dir)
    if client is None:
        raise RunCtlError(f"{run_dir}: no supervisor is running (start one with `up` or "
                          "`resume`)")
    try:
        return await client.call(method, params, timeout=120.0)
    finally:
        await client.close()
