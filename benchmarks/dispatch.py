"""Dispatch cost: 20,000 prompts against 4 simulators answering with no delay.

The engine (`fleetdeck-agent generate`, with group commit, fsync, accounting, progress) beside
a baseline written the obvious way (asyncio, httpx, one global semaphore, append to one JSONL,
no durability), measured in the same run. Prints process CPU seconds per 1,000 completions,
completions per second, and the ratio. Target: engine CPU per completion <= 1.0x baseline.

    .venv/bin/python benchmarks/dispatch.py [--prompts 20000] [--servers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.engine.runs import write_prompts, write_spec  # noqa: E402
from tests.servers.ports import kill_pid  # noqa: E402
from tests.simserver import start_sim  # noqa: E402

BASELINE = r'''
import asyncio, json, sys, httpx
urls, prompts, out, conc = json.loads(sys.argv[1])
async def main():
    sem = asyncio.Semaphore(conc * len(urls))
    clients = [httpx.AsyncClient(base_url=u, timeout=600,
               limits=httpx.Limits(max_connections=conc + 8)) for u in urls]
    f = open(out, "a")
    async def one(i, line):
        async with sem:
            body = json.loads(line)
            msgs = body.get("messages") or [{"role": "user", "content": t["value"]}
                                            for t in body["conversations"] if t["from"] == "human"]
            r = await clients[i % len(clients)].post("/v1/chat/completions", json={
                "model": "default", "messages": msgs, "max_tokens": 256})
            d = r.json()
            f.write(json.dumps({"index": i, "content": d["choices"][0]["message"]["content"],
                                "usage": d["usage"]}) + "\n")
    with open(prompts) as p:
        await asyncio.gather(*(one(i, l) for i, l in enumerate(p)))
    f.close()
asyncio.run(main())
'''


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    before = child_cpu()
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return child_cpu() - before, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fd-bench-dispatch-"))
    sims = [start_sim(root, "--no-delay", "--load-seconds", "0", "--seed", str(i), name=f"sim{i}")
            for i in range(args.servers)]
    try:
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, args.prompts)
        urls = [s.url for s in sims]
        base_cpu, base_wall = timed([sys.executable, "-c", BASELINE, json.dumps(
            [urls, str(prompts), str(root / "baseline.jsonl"), args.concurrency])])
        spec = write_spec(root / "run.toml", prompts, urls, batch_size=500, max_tokens=256,
                          concurrency_per_server=args.concurrency)
        env = dict(os.environ)
        eng_cpu, eng_wall = timed([sys.executable, "-m", "agents.cli", "generate", str(spec)],
                                  env)
        done = json.loads((root / "run" / "progress.json").read_text())["completed"]
        n = args.prompts
        print(f"{n:,} prompts, {args.servers} simulators (no delay), "
              f"{args.concurrency} in flight per server")
        print(f"baseline: {base_cpu / n * 1000:.3f} CPU s per 1,000, {n / base_wall:,.0f} "
              f"completions/s ({base_wall:.1f} s wall)")
        print(f"engine:   {eng_cpu / done * 1000:.3f} CPU s per 1,000, {done / eng_wall:,.0f} "
              f"completions/s ({eng_wall:.1f} s wall, {done:,} completed)")
        ratio = (eng_cpu / done) / (base_cpu / n)
        print(f"ratio engine/baseline CPU per completion: {ratio:.2f}x (target <= 1.0x)")
    finally:
        for s in sims:
            kill_pid(s.proc)


if __name__ == "__main__":
    main()
