"""Test helpers for engine runs: prompt files, run.toml, the engine as a real process, and
the invariant-1 checker that reads a run directory the way any reader would."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.servers.ports import wait_until


def write_prompts(path: Path, n: int, bad_every: int = 0, seed: int = 0) -> set[int]:
    """n prompt lines in both shapes (ShareGPT and OpenAI, some with tools and system
    prompts); every `bad_every`-th line malformed. Returns the malformed indices."""
    rng = random.Random(seed)
    bad: set[int] = set()
    with open(path, "w") as f:
        for i in range(n):
            if bad_every and i % bad_every == bad_every - 1:
                bad.add(i)
                f.write(rng.choice(['{"messages": [', "not json at all", '{"foo": 1}',
                                    '{"conversations": []}']) + "\n")
                continue
            if i % 2:
                obj: dict[str, Any] = {
                    "id": f"p{i}",
                    "conversations": [
                        {"from": "system", "value": "You are helpful."},
                        {"from": "human", "value": f"Question {i}: explain topic {i % 97}."},
                        {"from": "gpt", "value": "old answer to be regenerated"},
                    ],
                }
            else:
                obj = {"messages": [{"role": "user", "content": f"Task {i}: write {i % 13} lines"}]}
                if i % 8 == 0:
                    obj["tools"] = [{"type": "function", "function": {
                        "name": "search", "parameters": {"type": "object", "properties": {}}}}]
            f.write(json.dumps(obj) + "\n")
    return bad


def write_spec(path: Path, prompts: Path, urls: list[str], s3: Any = None,
               sampling: dict[str, Any] | None = None,
               chat_template_kwargs: dict[str, Any] | None = None, **generate: Any) -> Path:
    gen = {"prompts": str(prompts), "max_tokens": 256, "concurrency_per_server": 8,
           "batch_size": 50, "retries": 3, "request_timeout_s": 30.0,
           "connect_timeout_s": 2.0, "drain_timeout_s": 30.0}
    gen.update(generate)
    lines = ["[run]", 'name = "test-run"', 'kind = "generate"', f'dir = "{path.parent / "run"}"',
             "", "[servers]", f"urls = {json.dumps(urls)}", "", "[generate]"]
    for k, v in gen.items():
        lines.append(f"{k} = {json.dumps(v)}")
    lines.append("[generate.sampling]")
    for k, v in (sampling if sampling is not None else {"temperature": 0.6, "top_p": 0.95}).items():
        lines.append(f"{k} = {json.dumps(v)}")
    if chat_template_kwargs:
        lines.append("[generate.chat_template_kwargs]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in chat_template_kwargs.items()]
    if s3 is not None:
        lines += ["", "[s3]", f'bucket = "{s3.bucket}"', 'prefix = "runs/test/"',
                  f'endpoint_url = "{s3.endpoint_url}"', 'region = "us-east-1"']
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class EngineProc:
    spec: Path
    run_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def progress(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.run_dir / "progress.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None


def start_engine(spec: Path, env: dict[str, str] | None = None, tag: str = "") -> EngineProc:
    run_dir = spec.parent / "run"
    log = spec.parent / f"engine{tag}-{time.monotonic_ns()}.log"
    full_env = dict(os.environ)
    full_env["FLEETDECK_PROGRESS_INTERVAL_S"] = "0.2"
    full_env.update(env or {})
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agents.cli", "generate", str(spec)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
        )
    return EngineProc(spec, run_dir, proc, log)


def wait_progress(engine: EngineProc, cond: Any, timeout: float, what: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def check() -> bool:
        p = engine.progress()
        if p is not None and cond(p):
            seen.update(p)
            return True
        return False

    wait_until(check, timeout, what)
    return seen


@dataclass
class RunState:
    total: int
    current: dict[int, dict[str, Any]] = field(default_factory=dict)
    done_indices: Counter[tuple[int, int]] = field(default_factory=Counter)
    failed: set[int] = field(default_factory=set)
    batch_numbers: list[int] = field(default_factory=list)
    lines: int = 0
    keys: Counter[tuple[int, int]] = field(default_factory=Counter)

    @property
    def todo(self) -> set[int]:
        return set(range(self.total)) - set(self.current) - self.failed


def read_run(run_dir: Path, after_kill: bool = False) -> RunState:
    """Read the run directory as any reader would, and assert invariant 1 on the way.

    Right after a kill (before recovery) lines may be on disk whose indices are not yet
    recorded, never the other way round."""
    pin = json.loads((run_dir / "run.pin.json").read_text())
    st = RunState(total=pin["prompts_lines"])
    comp = run_dir / "completions"
    partials = sorted(comp.glob("*.partial"))
    assert len(partials) <= 1, f"several open batches: {partials}"
    for path in sorted(comp.glob("completions_*.jsonl*")):
        number = int(path.name.split("_")[1].split(".")[0])
        st.batch_numbers.append(number)
        data = path.read_bytes()
        if after_kill and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]  # a torn last line, cut by recovery
        for raw in data.splitlines():
            line = json.loads(raw)
            st.lines += 1
            key = (line["index"], line.get("attempt", 1))
            st.keys[key] += 1
            old = st.current.get(line["index"])
            if old is None or line["attempt"] > old["attempt"]:
                st.current[line["index"]] = line
    dup = [k for k, n in st.keys.items() if n > 1]
    assert not dup, f"lines written twice for (index, attempt): {dup[:10]}"
    for raw in (comp / ".done_indices").read_text().splitlines():
        parts = raw.split()
        st.done_indices[(int(parts[0]), int(parts[1]) if len(parts) > 1 else 1)] += 1
    if after_kill:
        assert set(st.done_indices) <= set(st.keys), "an index recorded before its line"
    else:
        assert set(st.done_indices) == set(st.keys), (
            "done indices and batch lines disagree: "
            f"{sorted(set(st.done_indices) ^ set(st.keys))[:10]}")
    assert all(n == 1 for n in st.done_indices.values()), "an index recorded twice"
    last: dict[int, str] = {}
    fpath = run_dir / "failures.jsonl"
    if fpath.exists():
        for raw in fpath.read_text().splitlines():
            ev = json.loads(raw)
            if ev.get("index") is not None:
                last[ev["index"]] = ev["event"]
    st.failed = {i for i, ev in last.items() if ev == "failed" and i not in st.current}
    assert len(set(st.batch_numbers)) == len(st.batch_numbers), "a batch number reused"
    return st
