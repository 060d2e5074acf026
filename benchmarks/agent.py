"""Node agent cost: the status snapshot and the RPC round trip over SSH.

1. Snapshot: CPU per status snapshot of an 8-server run (what the supervisor pushes each
   second), built by the real Supervisor over a real, prepared Engine with filled-in counters
   and no network probes, beside `json.dumps` of the same data as a plain dict.
2. RPC: `fleetdeck-agent serve --stdio` on one asyncssh connection to a real OpenSSH sshd on
   loopback, `status` round trips one at a time, beside `ssh host true` (the OpenSSH client, a
   new connection each) and `conn.run("true")` on the open connection; first with no
   supervisor (answers from disk), then through a live supervisor driving 2 simulators.
   sshd runs every command through the user's shell, which reads ~/.bashrc: its start-up,
   timed alone, is printed beside the baselines (every exec pays it, round trips do not).

Every baseline is measured in the same run.

    .venv/bin/python benchmarks/agent.py [--iterations 2000] [--requests 200] [--ssh-runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh
import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents import PROTOCOL_VERSION  # noqa: E402
from agents.engine.run import Engine  # noqa: E402
from agents.ewma import EwmaRate  # noqa: E402
from agents.rpc.protocol import RpcClient  # noqa: E402
from agents.rundir.schema import encoder  # noqa: E402
from agents.rundir.spec import load_spec  # noqa: E402
from agents.supervise.procinfo import alive  # noqa: E402
from agents.supervise.supervisor import Supervisor  # noqa: E402
from tests.engine.runs import write_prompts, write_spec  # noqa: E402
from tests.servers.ports import kill_pid, wait_until  # noqa: E402
from tests.servers.sshd import SshServer, start_sshd  # noqa: E402
from tests.simserver import SimHandle, start_sim  # noqa: E402

SERVERS = 8
AGENT = str(ROOT / ".venv" / "bin" / "fleetdeck-agent")


# -- 1. the snapshot --------------------------------------------------------------------------

def _rate(per_s: float, tau_s: float) -> EwmaRate:
    r = EwmaRate(tau_s, now=0.0)
    r.add(per_s)
    r.tick(1.0)
    return r


def offline_engine(root: Path) -> Engine:
    """A prepared engine over 8 unreachable URLs, its counters set as mid-run (no request is
    ever sent: prepare() only builds clients). Server 3 is down, server 5's accept length low,
    so the snapshot carries two alerts."""
    prompts = root / "prompts.jsonl"
    write_prompts(prompts, 20_000)
    urls = [f"http://10.255.0.{n + 1}:30000" for n in range(SERVERS)]
    spec = load_spec(write_spec(root / "run.toml", prompts, urls, concurrency_per_server=40))
    engine = Engine(spec)
    engine.prepare()
    engine.status = "running"
    done = 0
    for s in engine.servers:
        n = s.number
        s.completed, s.failed, s.in_flight = 1_200 + 37 * n, n, 30 + n
        s.req_rate, s.tok_rate = _rate(1.9 + 0.1 * n, 30.0), _rate(1_850.5 + 10 * n, 30.0)
        s.verify_ct, s.spec_tokens, s.output_tokens = 1_000, 3_400 + 20 * n, 900_000 + n
        done += s.completed
    down = engine.servers[3]
    down.state, down.in_flight, down.errors_in_row = "down", 0, 3
    down.last_error = "ConnectError: [Errno 111] Connection refused"
    engine.servers[5].spec_tokens = 1_800
    for i in range(done):
        engine.store.done.add(i)
    t = engine.meter.totals
    t.input_tokens, t.output_tokens, t.reasoning_tokens = 410 * done, 720 * done, 300 * done
    t.truncated, t.empty, t.retried = done // 50, 3, 12
    engine.meter.rate = _rate(16.2, 60.0)
    return engine


def cpu_ms(fn: Callable[[], Any], n: int) -> float:
    fn()
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n * 1000


def bench_snapshot(engine: Engine, n: int) -> None:
    sup = Supervisor(engine.run_dir)
    sup.engine = engine
    snap = sup.snapshot()
    plain = msgspec.to_builtins(snap)
    size = len(encoder.encode(snap))
    build = cpu_ms(sup.snapshot, n)
    push = cpu_ms(lambda: encoder.encode(sup.snapshot()), n)
    reply = cpu_ms(lambda: msgspec.json.encode(msgspec.to_builtins(sup.snapshot())), n)
    enc = cpu_ms(lambda: encoder.encode(snap), n)
    base = cpu_ms(lambda: json.dumps(plain), n)
    print(f"== 1. status snapshot, {SERVERS} servers: the real Supervisor over a prepared Engine "
          f"(counters set offline, no network probes, no NVML), {n:,} iterations, CPU time")
    print(f"   {len(snap.servers)} servers, {len(snap.alerts)} alerts "
          f"({', '.join(a.code for a in snap.alerts)}), {size:,} bytes of JSON")
    print(f"   snapshot build only:                      {build:8.4f} ms")
    print(f"   push  = encoder.encode(sup.snapshot()):    {push:8.4f} ms  "
          f"({push / 10:.3f}% of one core at 1 push/s)")
    print(f"   status reply = to_builtins + encode:      {reply:8.4f} ms")
    print(f"   encoder.encode(prebuilt snapshot):        {enc:8.4f} ms")
    print(f"   baseline json.dumps(plain dict, same data): {base:6.4f} ms")
    print(f"   ratio push / baseline:   {push / base:.2f}x")
    print(f"   ratio encode / baseline: {enc / base:.2f}x")


# -- 2. RPC over SSH --------------------------------------------------------------------------

def summary(label: str, xs: list[float]) -> str:
    s = sorted(xs)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    return (f"   {label:<44} n={len(xs):<4} mean {statistics.fmean(xs) * 1000:7.2f} ms  "
            f"p50 {statistics.median(xs) * 1000:7.2f} ms  p95 {p95 * 1000:7.2f} ms")


def ssh_true(sshd: SshServer, runs: int) -> list[float]:
    cmd = ["ssh", "-F", "/dev/null", "-i", str(sshd.client_key), "-o", "IdentitiesOnly=yes",
           "-o", f"UserKnownHostsFile={sshd.known_hosts}", "-o", "StrictHostKeyChecking=yes",
           "-o", "BatchMode=yes", "-p", str(sshd.port), f"{sshd.user}@{sshd.host}", "true"]
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


def remote_shell(runs: int) -> list[float]:
    """The user's shell as sshd starts it for a command (SSH_CLIENT set, a fresh SHLVL): bash
    then reads ~/.bashrc. Every exec pays it; the RPC round trips do not."""
    shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    env = {k: v for k, v in os.environ.items() if k != "SHLVL"}
    env["SSH_CLIENT"] = "127.0.0.1 50000 22"
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([shell, "-c", "true"], check=True, env=env, cwd=Path.home(),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


async def conn_true(conn: asyncssh.SSHClientConnection, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        await conn.run("true", check=True)
        out.append(time.perf_counter() - t)
    return out


async def rpc_status(conn: asyncssh.SSHClientConnection, run_dir: Path,
                     n: int) -> tuple[float, dict[str, Any], list[float], int]:
    """Open `serve --stdio` as an exec channel, hello, then n status calls one at a time.
    Returns (exec + hello seconds, hello result, round trips, reply bytes)."""
    command = (f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} "
               f"-m agents.cli serve {shlex.quote(str(run_dir))} --stdio")
    t = time.perf_counter()
    proc = await conn.create_process(command, encoding=None)
    client = RpcClient(proc.stdout, proc.stdin)  # type: ignore[arg-type]
    try:
        hello = await client.call("hello", {"protocol": PROTOCOL_VERSION})
        setup = time.perf_counter() - t
        rtts = []
        size = 0
        for _ in range(n):
            t = time.perf_counter()
            result = await client.call("status")
            rtts.append(time.perf_counter() - t)
            size = len(msgspec.json.encode(result))
        return setup, hello, rtts, size
    finally:
        proc.stdin.write_eof()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()


def start_live(root: Path, sims: list[SimHandle]) -> tuple[Path, int]:
    """`fleetdeck-agent up` over 2 simulators; returns (run dir, supervisor pid) once it has
    completions."""
    live = root / "live"
    live.mkdir()
    prompts = live / "prompts.jsonl"
    write_prompts(prompts, 20_000)
    spec = write_spec(live / "run.toml", prompts, [s.url for s in sims],
                      concurrency_per_server=4, max_tokens=128)
    out = subprocess.run([AGENT, "up", str(spec)], check=True, capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    pid = int(json.loads(out.stdout)["supervisor_pid"])
    run_dir = live / "run"

    def working() -> bool:
        try:
            return json.loads((run_dir / "progress.json").read_text())["completed"] > 0
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return False

    wait_until(working, 30, "the live run's first completions")
    return run_dir, pid


def completed(run_dir: Path) -> int:
    return int(json.loads((run_dir / "progress.json").read_text())["completed"])


def stop_live(run_dir: Path, pid: int) -> None:
    subprocess.run([AGENT, "down", str(run_dir), "--yes"], cwd=ROOT, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: not alive(pid), 30, f"supervisor {pid} to exit")
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)


def print_rpc(label: str, setup: float, hello: dict[str, Any], rtts: list[float], size: int,
              base: float, base_conn: float) -> None:
    mean = statistics.fmean(rtts)
    print(f"   -- {label}: hello says supervised={hello.get('supervised')}, "
          f"exec + hello {setup * 1000:.1f} ms, {size:,}-byte replies")
    print(summary("status round trip", rtts))
    print(f"   ratio status RTT / `ssh host true`:  {mean / base:.3f}x "
          f"({base / mean:.0f} status calls per new-connection command)")
    print(f"   ratio status RTT / conn.run('true'): {mean / base_conn:.3f}x")


async def bench_rpc(root: Path, run_dir: Path, args: argparse.Namespace) -> None:
    sshd = start_sshd(root / "sshd")
    sims: list[SimHandle] = []
    live: tuple[Path, int] | None = None
    try:
        conn = await asyncssh.connect(
            sshd.host, port=sshd.port, username=sshd.user, client_keys=[str(sshd.client_key)],
            known_hosts=str(sshd.known_hosts), agent_path=None, connect_timeout=10)
        async with conn:
            base = ssh_true(sshd, args.ssh_runs)
            base_conn = await conn_true(conn, args.ssh_runs)
            print(f"== 2. RPC over SSH on loopback (OpenSSH sshd, host key checked), "
                  f"one asyncssh connection, {args.requests} status calls one at a time")
            print(summary("baseline `ssh host true` (OpenSSH client)", base))
            print(summary("conn.run('true') on the open connection", base_conn))
            print(summary("the remote shell starting, timed locally",
                          remote_shell(args.ssh_runs)))
            mean_base, mean_conn = statistics.fmean(base), statistics.fmean(base_conn)
            setup, hello, rtts, size = await rpc_status(conn, run_dir, args.requests)
            print_rpc("no supervisor, serve answers from disk (part 1's run dir)", setup, hello,
                      rtts, size, mean_base, mean_conn)
            sims = [start_sim(root, "--time-scale", "0.01", "--load-seconds", "0",
                              "--seed", str(i), name=f"sim{i}") for i in range(2)]
            live = start_live(root, sims)
            before, t = completed(live[0]), time.perf_counter()
            setup, hello, rtts, size = await rpc_status(conn, live[0], args.requests)
            rate = (completed(live[0]) - before) / (time.perf_counter() - t)
            print_rpc(f"live supervisor, 2 simulators, job running (~{rate:.0f} completions/s)",
                      setup, hello, rtts, size, mean_base, mean_conn)
    finally:
        if live is not None:
            stop_live(*live)
        for s in sims:
            kill_pid(s.proc)
        sshd.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2_000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--ssh-runs", type=int, default=20)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fd-bench-agent-"))
    started = time.perf_counter()
    try:
        engine = offline_engine(root)
        bench_snapshot(engine, args.iterations)
        # serve --stdio reads progress.json when no supervisor runs: the same engine's.
        (engine.run_dir / "progress.json").write_bytes(encoder.encode(engine.snapshot()))
        asyncio.run(bench_rpc(root, engine.run_dir, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
