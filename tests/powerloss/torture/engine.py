"""The engine under power loss: one recording of a run on simulators (killed -9, max_tokens
raised and `retry truncated` with no engine running, killed again and
its power cut live, then resumed to the end), and the recovery a resume does (the engine's
prepare: store, journals, totals; then its last progress) on each crash state, checked against
what the run had claimed before the cut and against a recount of the lines on disk."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agents.artifacts.verify import verify_run
from agents.engine.loops import answer_tail, is_loop
from agents.engine.run import Engine
from agents.rundir.spec import RunSpec, load_spec
from tests.engine.runs import write_prompts
from tests.powerloss.harness import REPO, ForgetfulDir
from tests.powerloss.oplog import Op
from tests.powerloss.torture.cuts import Figures, Step, Violation, annotate, marks
from tests.powerloss.volume import Volume
from tests.servers.ports import kill_pid, wait_until
from tests.simserver import FAST_ARGS, start_sim

MARKS = "crashmarks"  # on the mount's root, beside the run dir
SYNC_S = 2.0  # totals.json's interval in the recording (FLEETDECK_TOTALS_SYNC_S)
SLACK_S = 15.0  # how late a loaded machine may be to sync it
LOG = logging.getLogger("fleetdeck")


def engine_env(fs: ForgetfulDir) -> dict[str, str]:
    return {**os.environ, "FLEETDECK_PROGRESS_INTERVAL_S": "0.2",
            "FLEETDECK_TOTALS_SYNC_S": str(SYNC_S), "FLEETDECK_CRASH_MARKS": str(fs / MARKS)}


def write_engine_spec(path: Path, prompts: Path, run_dir: Path, urls: list[str],
                      **generate: Any) -> Path:
    gen = {"prompts": str(prompts), "max_tokens": 48, "concurrency_per_server": 6,
           "batch_size": 20, "retries": 3, "request_timeout_s": 30.0, "connect_timeout_s": 2.0,
           "drain_timeout_s": 10.0, **generate}
    lines = ["[run]", 'name = "powerloss"', f"dir = {json.dumps(str(run_dir))}", "",
             "[servers]", f"urls = {json.dumps(urls)}", "", "[generate]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in gen.items()]
    lines += ["[generate.sampling]", "temperature = 0.6"]
    path.write_text("\n".join(lines) + "\n")
    return path


def agent(*args: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def start(spec: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "agents.cli", "generate", str(spec)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=REPO)


def progress(run_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((run_dir / "progress.json").read_bytes())
        return data
    except (OSError, ValueError):
        return {}


def done_on_disk(run_dir: Path) -> int:
    """Distinct indices in .done_indices (what a resume will find done)."""
    return len({i for i, _ in _keys(_read_file(run_dir / "completions" / ".done_indices"))})


def claimed_kept(claimed: int, run_dir: Path) -> int:
    """After a live power loss: every index progress.json had claimed is still recorded."""
    kept = done_on_disk(run_dir)
    if kept < claimed:
        raise Violation(f"progress.json claimed {claimed} done before the power loss, "
                        f".done_indices holds {kept} after it")
    return kept


def wait_completed(run_dir: Path, proc: subprocess.Popen[bytes], n: int, what: str,
                   may_end: bool = False) -> None:
    """Until progress.json says `n` completed (or, `may_end`, the engine ended first)."""
    wait_until(lambda: progress(run_dir).get("completed", 0) >= n or
               (may_end and proc.poll() is not None), 180, what,
               proc=None if may_end else proc)


@dataclass
class Recording:
    log: list[Op]
    spec: Path  # on the real disk; its run dir is on the mount (`run_dir`)
    run_dir: str  # relative to the mount root
    prompts: int
    live: dict[str, Any] = field(default_factory=dict)  # the live cut's findings


def record(fs: ForgetfulDir, root: Path, prompts: int = 240) -> Recording:
    """The scenario, recorded once. Returns after the run is done (and verified)."""
    args = (*FAST_ARGS, "--time-scale", "0.02", "--truncation-share", "0.3", "--empty-rate",
            "0.05", "--loop-share", "0.1")
    sims = [start_sim(root, *args, "--seed", str(i), name=f"sim{i}") for i in range(2)]
    try:
        return _scenario(fs, root, prompts, [s.url for s in sims])
    finally:
        for s in sims:
            kill_pid(s.proc)


def _scenario(fs: ForgetfulDir, root: Path, n: int, urls: list[str]) -> Recording:
    write_prompts(root / "prompts.jsonl", n, bad_every=40)
    run_dir = fs / "run"
    spec = write_engine_spec(root / "run.toml", root / "prompts.jsonl", run_dir, urls)
    env = engine_env(fs)
    rec = Recording([], spec, "run", n)
    logs = root / "engine.log"

    a = start(spec, env, logs)
    wait_completed(run_dir, a, n // 5, "engine A's first lines")
    kill_pid(a)  # a crash, not a power loss: the kernel keeps every write

    # max_tokens raised and `retry truncated` while no engine runs: B applies both at start.
    for args in (("max-tokens", str(run_dir), "200"), ("retry", str(run_dir), "truncated")):
        r = agent(*args, env=env)
        assert r.returncode == 0, r.stderr
    b = start(spec, env, logs)
    wait_completed(run_dir, b, n * 3 // 4, "engine B's lines", may_end=True)
    kill_pid(b)
    claimed = progress(run_dir).get("completed", 0)
    k = fs.power_loss()  # the live cut: a real resume follows
    rec.live = {"at": k, "claimed": claimed, "left": claimed_kept(claimed, run_dir)}

    c = start(spec, env, logs)
    assert c.wait(300) == 0, logs.read_text(errors="replace")[-3000:]
    report = verify_run(run_dir)
    assert report.ok, [ch for ch in report.checks if not ch.ok]
    check_totals(run_dir)
    done = progress(run_dir)
    assert done["completed"] + done["failed"] == n, done
    rec.live["resumed"] = done["completed"]
    rec.log = fs.oplog()
    return rec


# -- what the run claimed, from the log -------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """progress.json as a reader saw it at op `at` (written, fsynced or not), and the keys
    that .done_indices then held: what the run had told anyone it had done."""

    at: int
    done: frozenset[tuple[int, int]]
    failed: frozenset[int]
    gpu_hours: float
    gpus: int


def claims(log: list[Op], steps: list[Step], run_dir: str) -> list[Claim]:
    vol = Volume()
    out: list[Claim] = []
    tmp_prefix = f"{run_dir}/.progress.json."
    for step in steps:
        op = step.op
        if op.kind == "rename" and step.path.startswith(tmp_prefix) and \
                step.new_path == f"{run_dir}/progress.json":
            data = bytes(vol.child(int(op.args[0]), str(op.args[1])).data)
            p = json.loads(data)
            done = _keys(_read(vol, f"/{run_dir}/completions/.done_indices"))
            failed = _failed(_read(vol, f"/{run_dir}/failures.jsonl"))
            out.append(Claim(step.index + 1, done, failed, p["gpu_hours"], p.get("gpus", 0)))
        vol.apply(op)
    return out


def _read(vol: Volume, path: str) -> bytes:
    try:
        return bytes(vol.resolve(path).data)
    except OSError:
        return b""


def _keys(data: bytes) -> frozenset[tuple[int, int]]:
    out = set()
    for raw in data.split(b"\n")[:-1]:
        parts = raw.split()
        if parts:
            out.add((int(parts[0]), int(parts[1]) if len(parts) > 1 else 1))
    return frozenset(out)


def _failed(data: bytes) -> frozenset[int]:
    last: dict[int, str] = {}
    for raw in data.split(b"\n")[:-1]:
        ev = json.loads(raw)
        if ev.get("index") is not None:
            last[ev["index"]] = ev["event"]
    return frozenset(i for i, ev in last.items() if ev == "failed")


# -- recovery on a crash state ------------------------------------------------------------


def spec_at(s: RunSpec, run_dir: Path) -> RunSpec:
    """The recording's spec with its run dir moved to the crash state's copy, and no servers
    (recovery sends nothing; an HTTP client is 0.3 s of CA loading each on a loaded box)."""
    return msgspec.structs.replace(
        s, run=msgspec.structs.replace(s.run, dir=str(run_dir)),
        servers=msgspec.structs.replace(s.servers, urls=[]))


def recover(spec: RunSpec) -> Engine:
    """What a resume does before it sends anything, then its last progress: the engine's
    prepare (store, journal, ownership, totals) and release, in this process."""
    engine = Engine(spec)
    try:
        engine.prepare()
        engine.status = "stopped"
        engine.release()
    finally:
        for h in list(LOG.handlers):
            if isinstance(h, logging.FileHandler) and \
                    h.baseFilename.startswith(str(spec.run_dir)):
                LOG.removeHandler(h)
                h.close()
    return engine


def recount(run_dir: Path) -> dict[str, Any]:
    """The totals, counted from the lines on disk by this test's own reading of them."""
    lines: list[dict[str, Any]] = []
    for path in sorted((run_dir / "completions").glob("completions_*")):
        lines += [msgspec.json.decode(raw) for raw in path.read_bytes().splitlines()]
    current: dict[int, dict[str, Any]] = {}
    for ln in lines:
        if ln["index"] not in current or ln["attempt"] > current[ln["index"]]["attempt"]:
            current[ln["index"]] = ln
    by_limit = Counter(str(ln["max_tokens"]) for ln in lines)
    cut = Counter(str(ln["max_tokens"]) for ln in lines if ln["finish_reason"] == "length")
    return {
        "completed": len(current),
        "total_input_tokens": sum(ln["usage"]["prompt_tokens"] for ln in lines),
        "total_output_tokens": sum(ln["usage"]["completion_tokens"] for ln in lines),
        "total_reasoning_tokens": sum(ln["usage"]["reasoning_tokens"] for ln in lines),
        "truncated": sum(ln["finish_reason"] == "length" for ln in current.values()),
        "truncated_loops": sum(ln["finish_reason"] == "length" and is_loop(
            answer_tail(ln["content"], ln["reasoning_content"])) for ln in current.values()),
        "empty": sum(not ln["content"] and not ln["tool_calls"] for ln in lines),
        "answers_by_limit": dict(by_limit), "truncated_by_limit": dict(cut),
        "lines": len(lines),
    }


def check_totals(run_dir: Path) -> dict[str, Any]:
    """progress.json against the recount: every total exact."""
    p = progress(run_dir)
    want = recount(run_dir)
    lines = json.loads((run_dir / "totals.json").read_bytes())["lines"]
    got = {k: (lines if k == "lines" else p.get(k)) for k in want}
    if got != want:
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        raise Violation(f"totals after recovery differ from the lines (got, recount): {diff}")
    return p


class EngineCheck:
    """The recovery a resume does on a crash state, and what must hold after it."""

    def __init__(self, log: list[Op], steps: list[Step], run_dir: str, spec: RunSpec) -> None:
        self.said = claims(log, steps, run_dir)
        self.run_dir = run_dir
        self.spec = spec

    def __call__(self, k: int, folder: Path) -> dict[str, Any]:
        run_dir = folder / self.run_dir
        recover(spec_at(self.spec, run_dir))
        report = verify_run(run_dir)
        if not report.ok:
            raise Violation(f"verify: {[c.detail for c in report.checks if not c.ok]}")
        p = check_totals(run_dir)
        before = [c for c in self.said if c.at <= k]
        done = _keys((run_dir / "completions" / ".done_indices").read_bytes())
        failed = _failed(_read_file(run_dir / "failures.jsonl"))
        if before:
            claim = before[-1]
            lost = {i for i, _ in claim.done} - {i for i, _ in done}
            if lost:
                raise Violation(f"indices reported done at op {claim.at} are gone: "
                                f"{sorted(lost)[:20]}")
            unfailed = claim.failed - failed - {i for i, _ in done}
            if unfailed:
                raise Violation(f"failed indices forgotten: {sorted(unfailed)[:20]}")
            floor = claim.gpu_hours - claim.gpus * (SYNC_S + SLACK_S) / 3600
            if p["gpu_hours"] + 1e-6 < floor:
                raise Violation(f"GPU-hours {p['gpu_hours']} after recovery, "
                                f"{claim.gpu_hours} were reported at op {claim.at}")
        return {"lines kept": p["completed"], "GPU-s kept": round(p["gpu_hours"] * 3600)}


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def live_cut(fs: ForgetfulDir, root: Path, spec: Path, env: dict[str, str],
             crash_at: str | None = None, min_done: int = 30) -> dict[str, Any]:
    """A real engine killed (SIGKILL, or at a crash point), the power cut, a real resume to
    the end: verify green and every total exact."""
    run_dir = Path(load_spec(spec).run_dir)
    logs = root / "live.log"
    e = start(spec, {**env, "FLEETDECK_CRASH_AT": crash_at} if crash_at else env, logs)
    if crash_at:
        assert e.wait(240) == -signal.SIGKILL, logs.read_text(errors="replace")[-2000:]
    else:
        wait_completed(run_dir, e, min_done, "the live engine's lines")
        kill_pid(e)
    claimed = progress(run_dir).get("completed", 0)
    fs.power_loss()
    left = claimed_kept(claimed, run_dir)
    t = time.monotonic()
    r = start(spec, env, logs)
    assert r.wait(300) == 0, logs.read_text(errors="replace")[-3000:]
    v = agent("verify", str(run_dir), "--json", env=env)
    assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-2000:]
    check_totals(run_dir)
    return {"claimed": claimed, "recorded after the power loss": left,
            "resumed to": progress(run_dir)["completed"], "resume_s": time.monotonic() - t}


def torture(fs: ForgetfulDir, root: Path, cuts: int, seed: int,
            per_kind: int | None = None) -> Figures:
    from tests.powerloss.torture.cuts import SHM, choose, cut_all

    fig = Figures("engine")
    t = time.monotonic()
    rec = record(fs, root)
    fig.record_s = time.monotonic() - t
    fig.ops = len(rec.log)
    fig.notes.append(f"live cut at op {rec.live['at']}: {rec.live['claimed']} done claimed, "
                     f"{rec.live['left']} recorded after it, resumed to {rec.live['resumed']}")
    steps = annotate(rec.log)
    crash_marks = marks(steps, MARKS)
    check = EngineCheck(rec.log, steps, rec.run_dir, load_spec(rec.spec))
    points = choose(len(rec.log), crash_marks, cuts, seed, per_kind)
    cut_all(fig, rec.log, points, SHM / f"pl-engine-{os.getpid()}", check)
    fig.notes.append("crash points in the recording: " + ", ".join(
        f"{k} x{len(v)}" for k, v in sorted(crash_marks.items())))
    return fig
