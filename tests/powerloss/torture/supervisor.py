"""The supervisor and its servers under power loss: one recording of a supervised run on
simulators it launches (`up` with a secret, two resizes, a server SIGKILLed and restarted, then
the supervisor and its servers SIGKILLed, the power cut live and `resume` to the end), and on
each crash state what a resume reads before it acts (the spec copy with its base and secrets,
control.json, control.log.jsonl, servers.json) plus the engine's own recovery."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir import secrets
from agents.rundir.control import read_control
from agents.rundir.spec import load_run_spec, load_spec
from agents.supervise.procinfo import alive
from agents.supervise.servers import ServerRecord
from tests.engine.runs import write_prompts
from tests.plugins.supervised import kill_run, port_block
from tests.powerloss.harness import ForgetfulDir
from tests.powerloss.oplog import Op
from tests.powerloss.torture.cuts import (
    Figures,
    Step,
    Violation,
    annotate,
    choose,
    cut_all,
    marks,
)
from tests.powerloss.torture.engine import (
    MARKS,
    EngineCheck,
    agent,
    check_totals,
    claimed_kept,
    engine_env,
    progress,
)
from tests.servers.ports import wait_until

API_KEY = "sk-powerloss-secret"


def write_spec(root: Path, run_dir: Path, prompts: int) -> Path:
    write_prompts(root / "prompts.jsonl", prompts, bad_every=60)
    command = (f"{sys.executable} -m agents.sim --port {{port}} --model-path {{model}} "
               "--time-scale 0.03 --load-seconds 0.3 --truncation-share 0.2")
    lines = ["[run]", 'name = "powerloss-supervised"', f"dir = {json.dumps(str(run_dir))}", "",
             "[servers]", "gpus = [0, 1]", f"base_port = {port_block(2)}",
             'model = "qwen-sim"', f"command = {json.dumps(command)}",
             f"api_key = {json.dumps(API_KEY)}", "startup_timeout_s = 60",
             "restart_backoff_s = 0.3", "health_interval_s = 0.3", "health_timeout_s = 30", "",
             "[generate]", f"prompts = {json.dumps(str(root / 'prompts.jsonl'))}",
             "max_tokens = 64", "concurrency_per_server = 6", "batch_size = 25",
             "request_timeout_s = 30.0", "connect_timeout_s = 2.0"]
    spec = root / "run.toml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


def servers(run_dir: Path) -> list[dict[str, Any]]:
    try:
        data: list[dict[str, Any]] = json.loads((run_dir / "servers.json").read_bytes())
        return data
    except (OSError, ValueError):
        return []


class Recording:
    def __init__(self) -> None:
        self.log: list[Op] = []
        self.acks: dict[str, int] = {}  # what returned -> ops in the log then
        self.revs: list[tuple[int, int]] = []  # (ops when a resize returned, its rev)
        self.audits: list[int] = []  # ops when each audited call returned
        self.live: dict[str, Any] = {}
        self.victim = -1  # the number of the server SIGKILLed and relaunched


def record(fs: ForgetfulDir, root: Path, prompts: int = 400) -> tuple[Recording, Path]:
    run_dir = fs / "run"
    spec = write_spec(root, run_dir, prompts)
    env = engine_env(fs)
    rec = Recording()
    ops = lambda: int(fs.stats()["ops"])  # noqa: E731
    try:
        r = agent("up", str(spec), env=env)
        assert r.returncode == 0, r.stderr
        rec.acks["up"] = ops()
        rec.audits.append(ops())
        wait_until(lambda: progress(run_dir).get("completed", 0) >= 40, 180, "the run's lines")
        for level in (3, 9):
            r = agent("resize", str(run_dir), str(level), env=env)
            assert r.returncode == 0, r.stderr
            control = read_control(run_dir)
            assert control is not None
            rec.revs.append((ops(), control.rev))
            rec.audits.append(ops())
        rec.victim = servers(run_dir)[1]["number"]
        victim = servers(run_dir)[1]["pid"]
        os.killpg(victim, signal.SIGKILL)
        wait_until(lambda: any(s.get("restarts", 0) >= 1 and s["pid"] != victim
                               for s in servers(run_dir)), 120, "the server relaunched")
        rec.acks["restart"] = ops()
        wait_until(lambda: progress(run_dir).get("completed", 0) >= prompts // 2, 240,
                   "half the run")
        kill_run(run_dir)  # the supervisor and its servers' groups, SIGKILL
        wait_until(lambda: not any(alive(s["pid"]) for s in servers(run_dir) if s["pid"]),
                   60, "the servers gone")
        claimed = progress(run_dir).get("completed", 0)
        k = fs.power_loss()
        rec.live = {"at": k, "claimed": claimed, "left": claimed_kept(claimed, run_dir)}
        t = time.monotonic()
        r = agent("resume", str(run_dir), env=env)
        assert r.returncode == 0, r.stderr
        rec.audits.append(ops())
        wait_until(lambda: progress(run_dir).get("status") == "done", 300, "the resumed run")
        rec.live["resume_s"] = time.monotonic() - t
        v = agent("verify", str(run_dir), "--json", env=env)
        assert v.returncode == 0, v.stdout[-3000:]
        check_totals(run_dir)
        rec.live["resumed"] = progress(run_dir)["completed"]
    finally:
        agent("down", str(run_dir), "--yes", env=env)
        kill_run(run_dir)
    rec.log = fs.oplog()
    return rec, spec


def saves(steps: list[Step], path: str = "run/servers.json") -> list[tuple[int, int | None, bytes]]:
    """Each replace of `path` (atomic_write's rename of its temp file), from the log: the
    rename's index; the index of the first fsync of the folder after it, from which the new
    version is durable (None when none came before the log's end or a power loss); and the
    version's bytes."""
    folder = path.rpartition("/")[0]
    data: dict[str, bytearray] = {}  # the temp files' bytes so far, by path
    out = []
    for s in steps:
        if s.op.kind == "create":
            data[s.path] = bytearray()
        elif s.op.kind == "write" and s.path in data:
            at, chunk = int(s.op.args[1]), s.op.args[2]
            assert isinstance(chunk, bytes)
            buf = data[s.path]
            buf[len(buf):at] = bytes(max(0, at - len(buf)))
            buf[at:at + len(chunk)] = chunk
        elif s.op.kind == "rename" and s.new_path == path:
            synced = None
            for t in steps[s.index + 1:]:
                if t.op.kind == "power_loss":
                    break
                if t.op.kind == "fsyncdir" and t.path == folder:
                    synced = t.index
                    break
            out.append((s.index, synced, bytes(data.get(s.path, b""))))
    return out


def restart_recorded(steps: list[Step], victim: int, seen_at: int) -> int | None:
    """The prefix from which a durable servers.json holds the victim's restart: the first
    save that holds it, once its folder fsync is in. The recording saw it at `seen_at` ops
    (a read of the file, which may fall between that save's rename and its folder fsync:
    the save had not returned, nothing was durable yet). A save whose folder nobody fsynced
    before the power loss was never durable (None): the recording saw the rename, then
    SIGKILLed the supervisor before its folder fsync (ci, a loaded box: the run was half done
    when the relaunch was seen), and a resume may rightly forget that restart."""
    for at, synced, data in saves(steps):
        recs = {r.number: r for r in msgspec.json.decode(data, type=list[ServerRecord])}
        if victim in recs and recs[victim].restarts >= 1:
            if at >= seen_at:
                raise AssertionError(f"the restart was seen at op {seen_at}, its save is op {at}")
            return None if synced is None else synced + 1
    raise AssertionError("no save of servers.json holds the restart that was seen")


def torture(fs: ForgetfulDir, root: Path, cuts: int, seed: int,
            per_kind: int | None = None) -> Figures:
    from tests.powerloss.torture.cuts import SHM

    fig = Figures("supervisor")
    t = time.monotonic()
    rec, spec_path = record(fs, root)
    fig.record_s = time.monotonic() - t
    fig.ops = len(rec.log)
    fig.notes.append(f"live cut at op {rec.live['at']}: {rec.live['claimed']} done claimed, "
                     f"{rec.live['left']} recorded after it, resumed to "
                     f"{rec.live['resumed']} in {rec.live['resume_s']:.0f} s")
    steps = annotate(rec.log)
    crash_marks = marks(steps, MARKS)
    # Each servers.json version is what a resume adopts from: cut right after its rename (not
    # durable yet: the version before it must be whole) and once its folder fsync made it so.
    replaced = saves(steps)
    crash_marks["servers.json renamed"] = [at + 1 for at, _, _ in replaced]
    crash_marks["servers.json saved"] = [synced + 1 for _, synced, _ in replaced
                                         if synced is not None]
    crash_marks["live cut"] = [rec.live["at"]]
    # The restart counts from the moment a durable servers.json held it, and from then on in
    # every state: the live cut's, and every one after it (the resume's saves included).
    restarted = restart_recorded(steps, rec.victim, rec.acks["restart"])
    if restarted is None:
        fig.notes.append("the restart's save was cut before its folder fsync: never durable")
        restarted = 1 << 62
    controlled = min((synced + 1 for _, synced, _ in saves(steps, "run/control.json")
                      if synced is not None), default=1 << 62)
    engine = EngineCheck(rec.log, steps, "run", load_spec(spec_path))

    def check(k: int, folder: Path) -> dict[str, Any]:
        run_dir = folder / "run"
        found: dict[str, Any] = {}
        if k >= rec.acks["up"]:
            spec = load_run_spec(run_dir)  # run.toml, run.base and secrets.json
            if spec.servers.api_key != API_KEY:
                raise Violation(f"the secret came back as {spec.servers.api_key!r}")
            if secrets.read(run_dir) is None:
                raise Violation("secrets.json is gone")
            control = read_control(run_dir)
            # `up` answers once the supervisor listens; the engine writes rev 1 (run.toml's
            # values, which a resume writes again) when it starts, durable from its folder
            # fsync on; each resize is durable when it answers.
            answered = [r for at, r in rec.revs if at <= k]
            rev, why = ((max(answered), "had been answered") if answered else
                        (1, f"was durable from op {controlled}") if k >= controlled else
                        (0, ""))
            if rev and (control is None or control.rev < rev):
                raise Violation(f"control.json at rev {control and control.rev}, rev {rev} "
                                f"{why}")
            audit = (run_dir / "control.log.jsonl").read_bytes().splitlines()
            want = sum(at <= k for at in rec.audits)
            if len(audit) < want:
                raise Violation(f"{len(audit)} audit records, {want} calls had returned")
            [json.loads(a) for a in audit]
            found["control revs kept"] = control.rev if control is not None else 0
        if k >= restarted and not (run_dir / "servers.json").exists():
            raise Violation(f"servers.json, durable from op {restarted}, is gone")
        if (run_dir / "servers.json").exists():
            recs = msgspec.json.decode((run_dir / "servers.json").read_bytes(),
                                       type=list[ServerRecord])
            restarts = {r.number: r.restarts for r in recs}
            if k >= restarted and restarts.get(rec.victim, 0) < 1:
                raise Violation(f"servers.json forgot the restart it had recorded (server "
                                f"{rec.victim}'s, durable from op {restarted}): {restarts}")
            found["servers.json kept"] = 1
        if k >= rec.acks["up"]:
            for key, value in engine(k, folder).items():
                found[key] = value
        return found

    points = choose(len(rec.log), crash_marks, cuts, seed, per_kind)
    cut_all(fig, rec.log, points, SHM / f"pl-supervisor-{os.getpid()}", check)
    return fig
