"""Dispatch cost: prompts against simulators answering with no delay.

The engine (`fleetdeck-agent generate`, with group commit, fsync, journal, accounting,
progress) beside two clients written the obvious way, measured in the same run, interleaved,
over several rounds: asyncio + aiohttp (the client SGLang's `bench_serving` and vLLM's
benchmarks use) and asyncio + httpx; each a semaphore, one JSONL appended to, no durability.
Each figure is the median of the rounds; CPU is that process's own (rusage of the child: the
simulators are not counted). Prints CPU seconds per 1,000 completions, completions per second
and the ratios against the aiohttp client, with the load average. Targets: engine CPU per
completion <= 1.0x aiohttp's, completions/s >= 0.9x aiohttp's (where aiohttp is client-bound).

    .venv/bin/python benchmarks/dispatch.py [--prompts 10000] [--servers 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.engine.runs import write_prompts, write_spec  # noqa: E402
from tests.servers.ports import kill_pid  # noqa: E402
from tests.simserver import start_sim  # noqa: E402

# Both naive clients read a prompt line the way the engine does (messages, or ShareGPT
# conversations), send the same body, and append the answer's content and usage.
COMMON = r'''
import asyncio, json, sys
urls, prompts, out, conc = json.loads(sys.argv[1])
def messages(line):
    body = json.loads(line)
    return body.get("messages") or [{"role": "user", "content": t["value"]}
                                    for t in body["conversations"] if t["from"] == "human"]
'''

# Keep-alive under SGLang's (uvicorn's 5 s), as the engine's: with aiohttp's 15 s a connection
# the server has just closed is taken again (thousands in flight, some idle for a while), and
# a request that ends in a transport error is sent again, twice at most (benchmarks/scale.py:
# at 10,000 in flight on a loaded box one run exited on an error its stderr, not kept then,
# would have named), as is one a router answered 5xx (SGLang's router, at 9,750 in flight on
# 2 cores, failed a burst of upstream sends past its own 5 retries); any other HTTP error
# ends the run, said plainly.
AIOHTTP = COMMON + r'''
import aiohttp
async def main():
    sem = asyncio.Semaphore(conc * len(urls))
    sessions = [aiohttp.ClientSession(u, connector=aiohttp.TCPConnector(
                    limit=conc + 8, keepalive_timeout=4),
                    timeout=aiohttp.ClientTimeout(total=600)) for u in urls]
    f = open(out, "a")
    async def one(i, line):
        async with sem:
            for again in (True, True, False):
                try:
                    async with sessions[i % len(sessions)].post("/v1/chat/completions", json={
                            "model": "default", "messages": messages(line),
                            "max_tokens": 256}) as r:
                        if r.status >= 500 and again:  # a router's failed upstream send
                            await r.read()
                            continue
                        if r.status != 200:  # said plainly, and the run fails
                            raise SystemExit(f"index {i}: HTTP {r.status} from {r.url}: "
                                             f"{(await r.text())[:300]}")
                        d = await r.json()
                    break
                except aiohttp.ClientError:  # a transport error (an HTTP error is raised above)
                    if not again:
                        raise
            f.write(json.dumps({"index": i, "content": d["choices"][0]["message"]["content"],
                                "usage": d["usage"]}) + "\n")
    with open(prompts) as p:
        await asyncio.gather(*(one(i, l) for i, l in enumerate(p)))
    f.close()
    for s in sessions:
        await s.close()
asyncio.run(main())
'''

HTTPX = COMMON + r'''
import httpx
async def main():
    sem = asyncio.Semaphore(conc * len(urls))
    clients = [httpx.AsyncClient(base_url=u, timeout=600,
               limits=httpx.Limits(max_connections=conc + 8)) for u in urls]
    f = open(out, "a")
    async def one(i, line):
        async with sem:
            r = await clients[i % len(clients)].post("/v1/chat/completions", json={
                "model": "default", "messages": messages(line), "max_tokens": 256})
            d = r.json()
            f.write(json.dumps({"index": i, "content": d["choices"][0]["message"]["content"],
                                "usage": d["usage"]}) + "\n")
    with open(prompts) as p:
        await asyncio.gather(*(one(i, l) for i, l in enumerate(p)))
    f.close()
asyncio.run(main())
'''


def timed(cmd: list[str], env: dict[str, str] | None = None,
          poll: Callable[[float, int], float] | None = None) -> tuple[float, float]:
    """(CPU s of that process alone, wall s). `poll`, if given, is called with the seconds
    since the start and the pid while the process runs, and returns how long to wait until
    it is called again."""
    t = time.perf_counter()
    # stderr kept (in a file: a pipe nobody reads would block the child) for a failure's why.
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        pid = 0
        while poll is not None and not pid:
            time.sleep(poll(time.perf_counter() - t, proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if not pid:
            _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            shown = " ".join(c if len(c) < 80 else f"{c[:60]}..." for c in cmd[:4])
            err.seek(0)
            # asyncio's and aiohttp's warnings at exit ("Unclosed ...") left out.
            tail = [line for line in err.read().decode(errors="replace").splitlines()
                    if line.strip() and "nclosed" not in line and "client_session" not in line
                    and "connector:" not in line][-6:]
            raise SystemExit(f"{shown} exited {proc.returncode}"
                             + "".join(f"\n  | {line}" for line in tail))
    return usage.ru_utime + usage.ru_stime, wall


def completed(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    # Raise the soft open-files limit: servers x concurrency sockets, and the simulators'.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    root = Path(tempfile.mkdtemp(prefix="fd-bench-dispatch-"))
    sims = [start_sim(root, "--no-delay", "--load-seconds", "0", "--seed", str(i), name=f"sim{i}")
            for i in range(args.servers)]
    n = args.prompts
    figures: dict[str, list[tuple[float, float]]] = {"aiohttp": [], "httpx": [], "engine": []}
    try:
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, n)
        urls = [s.url for s in sims]
        env = dict(os.environ)
        for r in range(args.rounds):
            # httpx is ten times slower: one round of it is the reference.
            for name, script in (("aiohttp", AIOHTTP), ("httpx", HTTPX))[:2 if r == 0 else 1]:
                out = root / f"{name}-{r}.jsonl"
                cpu, wall = timed([sys.executable, "-c", script, json.dumps(
                    [urls, str(prompts), str(out), args.concurrency])])
                assert completed(out) == n, f"{name}: {completed(out)} of {n} lines"
                figures[name].append((cpu / n, n / wall))
            (root / f"r{r}").mkdir()
            spec = write_spec(root / f"r{r}" / "run.toml", prompts, urls, batch_size=500,
                              max_tokens=256, concurrency_per_server=args.concurrency)
            cpu, wall = timed([sys.executable, "-m", "agents.cli", "generate", str(spec)], env)
            done = json.loads((root / f"r{r}" / "run" / "progress.json").read_text())["completed"]
            assert done == n, f"engine: {done} of {n} completed"
            figures["engine"].append((cpu / done, done / wall))
        load = os.getloadavg()
        print(f"{n:,} prompts, {args.servers} simulators (no delay), {args.concurrency} in "
              f"flight per server, median of {args.rounds} interleaved rounds (httpx: one); "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
        med = {k: (statistics.median(c for c, _ in v), statistics.median(s for _, s in v))
               for k, v in figures.items()}
        for name in ("aiohttp", "httpx", "engine"):
            cpu, rate = med[name]
            print(f"{name + ':':9} {cpu * 1000:.3f} CPU s per 1,000, {rate:,.0f} completions/s")
        base_cpu, base_rate = med["aiohttp"]
        print(f"ratio engine/aiohttp CPU per completion: {med['engine'][0] / base_cpu:.2f}x "
              "(target <= 1.0x)")
        print(f"ratio engine/aiohttp completions/s: {med['engine'][1] / base_rate:.2f}x "
              "(target >= 0.9x)")
        print(f"ratio httpx/aiohttp CPU per completion: {med['httpx'][0] / base_cpu:.2f}x")
    finally:
        for s in sims:
            kill_pid(s.proc)


if __name__ == "__main__":
    main()
