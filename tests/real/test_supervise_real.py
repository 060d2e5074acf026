"""Supervision as the real SGLang 0.5.23 behaves: an agent-managed run (`fleetdeck-agent up`)
whose server 0 is a real server the supervisor launches, watches, loses to SIGKILL and to a
hang, and relaunches, and whose server 1 is tests/real/forward.py in front of the tier's shared
server, where a hung server's requests go. Every rule is checked against what the real server
reports itself: /health, /metrics, /server_info, its log, its processes in /proc.

The tests run in order on one run (tests/real/managed.py). Start-ups, the tier's 3rd and 4th:
server 0's first and its relaunch after SIGKILL, both waited for; its relaunch after the hang
is checked as launched, and stopped by `down` while it loads, never waited for.

The health settings are stricter than the defaults (health_timeout_s 25 < 30, 2 failures to
down < 3, a check every second, a hung server killed 5 s after it is down): a loading or busy
server that keeps them keeps the defaults too, and a hang is found within a minute.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.supervise.procinfo import alive, group_members, start_time
from agents.supervise.sglang_log import READY, BatchRecord, LogReader, LogTail, read_log
from agents.supervise.sglang_metrics import parse_exposition, read_server_info
from tests.agent.test_sglang_real_0523 import COUNTERS, FALLBACKS, GAUGES
from tests.engine.runs import read_run
from tests.plugins.supervised import agent, kill_run, port_block
from tests.real.env import SGLANG_VERSION, RealEnv
from tests.real.managed import (
    Load,
    Managed,
    Sampler,
    cmdline,
    health,
    listening,
    proc_state,
    sglang_processes,
    spin,
)
from tests.real.server import READY_TIMEOUT_S, RealServer
from tests.servers.ports import wait_until

HEALTH: dict[str, float] = {
    "health_interval_s": 1, "health_timeout_s": 25, "health_failures_to_down": 2,
    "hung_restart_s": 5, "restart_backoff_s": 1, "startup_timeout_s": 900}
# SGLang's own limit on its health generation (SGLANG_HEALTH_CHECK_TIMEOUT): a server that
# answers at all answers within it, so the supervisor waits longer than that.
SGLANG_HEALTH_TIMEOUT_S = 20
HEAVY_S = 40  # the heavy load of the health test
# A test that waits for a start-up may wait READY_TIMEOUT_S for it (two: the shared server's
# and this one's, side by side on a loaded box); the others a few minutes.
pytestmark = pytest.mark.timeout(600)
START_UP = pytest.mark.timeout(READY_TIMEOUT_S + 600)


@pytest.fixture(scope="module")
def managed(real_env: RealEnv, real_root: Path) -> Iterator[Managed]:
    m = Managed(real_root / "supervised", real_env, port_block(2), HEALTH,
                decode_log_interval=10, prompts=60)
    m.root.mkdir(parents=True)
    spec = m.write_spec()
    m.up_at = time.time()
    r = agent("up", str(spec))
    assert r.returncode == 0, r.stderr
    m.sampler = Sampler(m.run_dir)
    try:
        yield m
    finally:
        m.samples.stop()
        if (m.run_dir / "supervisor.pid").exists():
            agent("down", str(m.run_dir), "--yes", timeout=120)
        kill_run(m.run_dir)
        print(f"\nsupervised real run: {json.dumps(m.timings)}")


def _live(m: Managed, since: float, until: float | None = None) -> list[Any]:
    return [s for s in m.samples.since(since, until) if s.live]


# ----- 1. start-up -------------------------------------------------------------------------

@START_UP
def test_start_up_is_starting_until_the_real_server_is_ready_then_healthy(
        managed: Managed, request: pytest.FixtureRequest) -> None:
    m = managed
    pid = m.record()["pid"]
    answers: dict[str, int] = {}  # the real server's own /health while it loads

    def probe() -> None:
        while True:
            code, _ = health(m.url, timeout=30)
            answers[code] = answers.get(code, 0) + 1
            if code == "200" or time.time() - m.up_at > READY_TIMEOUT_S:
                return
            time.sleep(1)  # the probe's pace, beside the supervisor's own checks

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    # The tier's shared server starts now if nothing started it yet, beside this load.
    shared: RealServer = request.getfixturevalue("default_server")
    prober.join(timeout=READY_TIMEOUT_S)
    assert answers.get("200") == 1, f"the real server never answered 200: {answers}"
    healthy = m.samples.first(m.up_at, lambda s: s.server(0)["state"] == "healthy", 60,
                              "the supervisor calls it healthy").snap
    first_healthy = m.samples.first(m.up_at, lambda s: s.server(0)["state"] == "healthy",
                                    1, "").t
    samples = _live(m, m.up_at, first_healthy)
    loading = [s for s in samples if s.server(0)["state"] != "healthy"]
    states = {s.server(0)["state"] for s in loading}
    assert states == {"starting"}, f"while it loaded the supervisor said {states}"
    assert all(s.server(0)["restarts"] == 0 and s.server(0)["pid"] == pid for s in samples)
    assert healthy["servers"][0]["pid"] == pid and healthy["servers"][0]["restarts"] == 0
    # The load outlasted every rule that calls a live server down or hung, so only
    # startup_timeout_s can have judged it; the server said no all that time.
    hung_after = HEALTH["health_failures_to_down"] * HEALTH["health_interval_s"] + \
        HEALTH["hung_restart_s"]
    assert loading[-1].t - loading[0].t > hung_after
    assert set(answers) - {"200"} <= {"refused", "503"} and sum(answers.values()) > 1, answers
    # Healthy only once the server said it was ready (its log's stamps are whole seconds).
    reader = read_log(m.log_path)
    assert reader.launches == 1 and reader.startup.ready and reader.startup.ready_line
    # Lines counted as the reader counts them: split on `\n` only. read_text's universal
    # newlines would also split on the bare `\r` of tqdm's bars and shift every number.
    text = m.log_path.read_bytes().decode(errors="replace")
    ready_line = text.split("\n")[reader.startup.ready_line - 1]
    assert READY in ready_line, ready_line
    assert first_healthy >= _log_stamp(ready_line) - 1
    # The launch: the template's real server, on its group's GPUs, with its two children.
    assert cmdline(pid).startswith(f"{m.env.python} -m sglang.launch_server --model-path "
                                   f"{m.env.model} --port {m.base_port} --tp 1 ")
    launch = (m.run_dir / "launch" / "launch_gpu0.sh").read_text()
    assert "export CUDA_VISIBLE_DEVICES=0\n" in launch and "SGLANG_USE_CPU_ENGINE=1" in launch
    assert set(sglang_processes(group_members(pid))) == {"sglang::scheduler",
                                                          "sglang::detokenizer"}
    # What the supervisor shows of its capacity is the server's own.
    body = httpx.get(f"{m.url}/server_info", timeout=30).json()
    info = read_server_info(body)
    assert info.version == SGLANG_VERSION == body["version"]
    assert info.max_total_num_tokens == 65536 == reader.startup.capacity["max_total_num_tokens"]
    cap = body["internal_states"][0]["effective_max_running_requests_per_dp"]
    assert info.effective_max_running == cap == reader.startup.max_running_requests
    row = m.wait(lambda s: s["servers"][0]["effective_max_running"] is not None, 60,
                 "figures")["servers"][0]
    assert row["effective_max_running"] == cap
    assert shared.ready_after_s is not None
    m.timings.update(start_up_s=round(first_healthy - m.up_at, 1))
    m.timings["health_while_loading"] = answers  # type: ignore[assignment]


def _log_stamp(line: str) -> float:
    """A server log line's `[YYYY-MM-DD HH:MM:SS]` as seconds since the epoch."""
    return datetime.strptime(line[1:20], "%Y-%m-%d %H:%M:%S").timestamp()


# ----- 2. figures --------------------------------------------------------------------------

def _candidates(records: list[BatchRecord], t: float) -> list[tuple[int, BatchRecord]]:
    """The lines whose figures /metrics may hold at time t: SGLang sets its gauges when it
    prints a decode or prefill line (and at idle), so t's values are the newest line's before
    t. Log stamps are whole seconds, and a reader is a few seconds behind: every line of the
    15 s before t (and the second after) counts, and the newest before those."""
    out = []
    older = None
    for i, r in enumerate(records):
        s = r.seconds()
        assert s is not None
        if s < t - 15:
            older = (i, r)
        elif s <= t + 1:
            out.append((i, r))
    return ([older] if older else []) + out


def _matches(records: list[BatchRecord], i: int, running: int | None, queued: int | None,
             usage: float | None, gen: float | None, used: int | None = None) -> bool:
    """Whether figures read from /metrics are those line i printed: the same requests, queue
    and KV usage (both to two places), and for a decode line its throughput and KV tokens; a
    prefill line prints no throughput, and /metrics keeps the last decode line's (or 0)."""
    r = records[i]
    if (r.running_reqs, r.queued_reqs) != (running, queued) or usage is None \
            or f"{r.token_usage:.2f}" != f"{usage:.2f}" or gen is None:
        return False
    if r.kind == "decode":
        return f"{r.gen_throughput:.2f}" == f"{gen:.2f}" and used in (None, r.num_tokens)
    last = next((p.gen_throughput for p in reversed(records[:i]) if p.kind == "decode"), 0.0)
    return f"{gen:.2f}" in ("0.00", f"{last:.2f}")


def test_the_figures_are_the_real_servers_own(managed: Managed) -> None:
    m = managed
    m.require()
    cap = httpx.get(f"{m.url}/server_info", timeout=30).json()[
        "internal_states"][0]["effective_max_running_requests_per_dp"]
    reader = LogReader()
    reader.keep_all = True
    tail = LogTail(m.log_path, reader, first_tail_bytes=1 << 30)
    tail.poll()
    first = len(reader.records)
    readings: list[tuple[float, Any]] = []  # /metrics, read as the supervisor reads it
    rows: list[dict[str, Any]] = []  # the supervisor's figures of server 0
    # 24 long requests at once: the server decodes them for the whole test (KV: 24 x 2,000
    # tokens fit in 65,536), and the health checks add a prefill line each.
    load = Load(m.url)
    load.wave(24, 2000)
    t0 = time.time()
    try:
        def enough() -> bool:
            readings.append((time.time(), m.metrics()))
            rows.append(m.status()["servers"][0])
            tail.poll()
            new = reader.records[first:]
            return len(readings) >= 10 and sum(
                r.kind == "decode" and (r.running_reqs or 0) >= 20 for r in new) >= 4
        wait_until(enough, 300, "four decode lines of the wave", interval=0.5)
    finally:
        load.stop()
    m.wait_idle()
    tail.poll()
    records = reader.records[first:]
    assert {r.graph_label for r in records} == {"cpu graph"}
    idle = decode = 0
    for n, (t, mr) in enumerate(readings):
        found = [i for i, _ in _candidates(records, t) if _matches(
            records, i, mr.running_reqs, mr.queued_reqs, mr.token_usage, mr.gen_throughput,
            mr.num_used_tokens)]
        if not found and (mr.running_reqs, mr.queued_reqs, mr.gen_throughput) == (0, 0, 0.0) \
                and idle == n:
            idle += 1  # before the wave's first line: SGLang's idle figures, printed by none
            continue
        near = [(r.timestamp, r.kind, r.running_reqs) for _, r in _candidates(records, t)]
        assert found, (f"/metrics at {t:.1f} matches no line the server printed: running "
                       f"{mr.running_reqs}, queued {mr.queued_reqs}, usage {mr.token_usage}, "
                       f"throughput {mr.gen_throughput}, tokens {mr.num_used_tokens}; lines "
                       f"then: {near}")
        decode += any(records[i].kind == "decode" for i in found)
    assert decode >= 3 and idle < len(readings) - 3, (decode, idle)
    busy_rows = idle_rows = 0
    for n, row in enumerate(rows):
        at = row["metrics_at"]
        assert at is not None and row["effective_max_running"] == cap, row
        ok = any(_matches(records, i, row["running_reqs"], row["queued_reqs"],
                          row["token_usage"], row["gen_throughput"])
                 for i, _ in _candidates(records, at))
        if not ok and (row["running_reqs"], row["queued_reqs"], row["gen_throughput"]) == \
                (0, 0, 0) and idle_rows == n:
            idle_rows += 1  # before the wave's first line
            continue
        assert ok, f"the supervisor showed figures the server never printed: {row}"
        busy_rows += ok and (row["running_reqs"] or 0) >= 20
    assert busy_rows >= 3, f"only {busy_rows} of {len(rows)} looks saw the wave running"
    # Every /metrics name the supervisor reads is one this server exports.
    exported = {s.name for s in parse_exposition(m.metrics_text())}
    assert set(GAUGES.values()) | set(COUNTERS.values()) <= exported
    assert not FALLBACKS & exported
    m.timings["figures_s"] = round(time.time() - t0, 1)


# ----- 3. health under load ----------------------------------------------------------------

def test_a_busy_real_server_is_never_called_down(managed: Managed) -> None:
    m = managed
    m.require()
    pid, restarts = m.record()["pid"], m.record()["restarts"]
    t0 = time.time()
    load = Load(m.url)
    load.closed(64, 48)  # 64 in flight all along, a prefill at every answer
    until = t0 + HEAVY_S
    ctx = multiprocessing.get_context("spawn")
    hogs = [ctx.Process(target=spin, args=(until,)) for _ in range(2)]  # one per core
    for h in hogs:
        h.start()
    probes: list[tuple[str, float]] = []  # /health as anyone gets it
    busiest = 0
    try:
        def over() -> bool:
            nonlocal busiest
            probes.append(health(m.url))
            busiest = max(busiest, m.active("/generate"))
            return time.time() >= until
        wait_until(over, HEAVY_S + 180, "the heavy load's end", interval=0.5)
    finally:
        for h in hogs:
            h.join(timeout=60)
        load.stop()
    m.wait_idle()
    samples = _live(m, t0, until)
    states = [s.server(0)["state"] for s in samples]
    assert set(states) <= {"healthy", "degraded"}, f"the busy server was called {set(states)}"
    assert all(s.server(0)["pid"] == pid and s.server(0)["restarts"] == restarts
               for s in _live(m, t0))
    checks = {s.server(0)["health_checked_at"] for s in samples}
    assert len(checks) >= HEAVY_S / 5, "the supervisor hardly checked during the load"
    assert busiest >= 48, f"the server held at most {busiest} requests: no heavy load"
    assert load.answers.get("200", 0) >= 64, load.answers
    slowest = max(s for _, s in probes)
    assert all(code == "200" for code, _ in probes), probes
    # A busy SGLang answers /health within its own 20 s, and the supervisor waits longer.
    assert slowest < SGLANG_HEALTH_TIMEOUT_S < HEALTH["health_timeout_s"]
    m.timings.update(heavy_health_slowest_s=round(slowest, 2), heavy_busiest=busiest,
                     heavy_degraded_looks=states.count("degraded"))


# ----- 4. adoption -------------------------------------------------------------------------

def _kill_supervisor(m: Managed) -> int:
    sup = int((m.run_dir / "supervisor.pid").read_text())
    os.kill(sup, signal.SIGKILL)
    wait_until(lambda: not alive(sup), 30, "the supervisor gone")
    r = agent("resume", str(m.run_dir))
    assert r.returncode == 0, r.stderr
    return sup


def test_a_new_supervisor_adopts_the_running_real_server(managed: Managed) -> None:
    m = managed
    m.require()
    real, forwarder = m.record(0), m.record(1)
    served = m.counter("num_requests_total")
    assert served > 0
    t0 = time.time()
    old = _kill_supervisor(m)
    snap = m.wait(lambda s: s["supervisor_pid"] != old and s["servers"][0]["state"] ==
                  "healthy", 120, "the new supervisor's word")
    after = m.record(0)
    assert after["pid"] == real["pid"] and after["restarts"] == real["restarts"]
    assert after["start_ticks"] == real["start_ticks"] == start_time(real["pid"])
    assert snap["servers"][0]["pid"] == real["pid"]
    # The server itself: the same process, its counters go on where they were.
    assert m.counter("num_requests_total") >= served
    log = m.supervisor_log()
    assert f"server 0 adopted (pid {real['pid']}," in log
    # Server 1 still waits for its upstream, as a server loads: adopted as such, not killed.
    assert m.record(1)["pid"] == forwarder["pid"] and alive(forwarder["pid"])
    assert f"server 1 adopted while it loads (pid {forwarder['pid']}," in log
    # Never down or restarted; the new supervisor says starting only while it asks /health.
    assert all(s.server(0)["state"] in ("healthy", "starting") and s.server(0)["pid"] ==
               real["pid"] and s.server(0)["restarts"] == real["restarts"] for s in _live(m, t0))
    m.timings["adopt_s"] = round(time.time() - t0, 1)


# ----- 5. SIGKILL --------------------------------------------------------------------------

@START_UP
def test_sigkill_leaves_no_process_frees_the_port_and_the_server_comes_back(
        managed: Managed) -> None:
    m = managed
    m.require()
    rec = m.record()
    pid, port, restarts = rec["pid"], rec["port"], rec["restarts"]
    members = group_members(pid)
    children = sglang_processes(members)
    assert set(children) == {"sglang::scheduler", "sglang::detokenizer"}
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)  # the launch process alone, as the OOM killer would
    looks: list[tuple[list[int], int]] = []

    def relaunched() -> bool:
        new = m.record()["pid"]  # first: a relaunch recorded, then what is left of the old
        looks.append(([p for p in members if alive(p)] + [
            p for p in group_members(pid) if p not in members], new))
        return bool(new != pid)

    wait_until(relaunched, 180, "server 0 relaunched", interval=0.05)
    gone_after = next((i for i, (left, _) in enumerate(looks) if not left), None)
    assert all(not left for left, new in looks if new != pid), \
        f"relaunched while the old server's processes ran: {looks[-3:]}"
    assert not any(alive(p) for p in members) and group_members(pid) == []
    assert all(proc_state(p) in (None, "Z") for p in children.values())
    # The port is free: the new server binds only when it has loaded.
    assert not listening(port), f"something still listens on {port}"
    new = m.record()["pid"]
    snap = m.wait(lambda s: s["servers"][0]["pid"] == new, 60, "the relaunch")
    assert snap["servers"][0]["restarts"] == restarts + 1
    assert snap["servers"][0]["state"] in ("starting", "restarting")
    # Adopted by the last test's supervisor, it is not its child: no exit status to give.
    assert f"process {pid} exited" in (snap["servers"][0]["last_error"] or "")
    m.samples.first(t_kill, lambda s: s.server(0)["state"] == "down", 30, "down, sampled")
    # A new supervisor while the relaunched server loads adopts it, loading.
    old = _kill_supervisor(m)
    snap = m.wait(lambda s: s["supervisor_pid"] != old, 60, "the new supervisor's word")
    assert snap["servers"][0]["pid"] == new and snap["servers"][0]["state"] == "starting"
    assert f"server 0 adopted while it loads (pid {new}," in m.supervisor_log()
    back = m.wait(lambda s: s["servers"][0]["state"] == "healthy", READY_TIMEOUT_S,
                  "the relaunched server healthy")
    assert back["servers"][0]["pid"] == new and back["servers"][0]["restarts"] == restarts + 1
    ready = m.samples.first(t_kill, lambda s: s.server(0)["pid"] == new
                            and s.server(0)["state"] == "healthy", 30, "healthy, sampled").t
    loading = {s.server(0)["state"] for s in _live(m, t_kill, ready)
               if s.server(0)["pid"] == new and s.t < ready}
    assert loading <= {"starting", "restarting"}, loading
    reader = read_log(m.log_path)
    assert reader.launches == 2 and reader.startup.ready  # the server's word: a new process
    assert set(sglang_processes(group_members(new))) == set(children)
    assert listening(port)
    m.timings.update(sigkill_group_gone_looks=gone_after or 0,
                     relaunch_healthy_s=round(time.time() - t_kill, 1))


# ----- 6. hang -----------------------------------------------------------------------------

_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _log_since(text: str, t: float) -> list[str]:
    out = []
    for line in text.splitlines():
        stamp = _LOG_LINE.match(line)
        if stamp and datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() >= t:
            out.append(line)
    return out


def _done_order(path: Path) -> list[int]:
    """The indices in the order their lines became durable (.done_indices: INDEX [ATTEMPT])."""
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]


def test_a_stopped_server_is_down_its_requests_finish_elsewhere_and_it_is_relaunched(
        managed: Managed, default_server: RealServer) -> None:
    m = managed
    m.require()
    default_server.wait_idle()
    # Server 1 listens now: every server is healthy, and the supervisor starts the job.
    m.upstream_file.write_text(f"127.0.0.1:{default_server.port}\n")
    m.wait(lambda s: s["servers"][1]["state"] == "healthy" and s["progress"] is not None
           and s["servers"][0]["in_flight"] >= 4, 300, "the job sending to both servers")
    rec = m.record()
    pid, restarts = rec["pid"], rec["restarts"]
    members = group_members(pid)
    done_file = m.run_dir / "completions" / ".done_indices"
    done_before = len(_done_order(done_file))
    t_stop = time.time()
    os.killpg(pid, signal.SIGSTOP)  # alive and silent: every process of the server
    wait_until(lambda: all(proc_state(p) == "T" for p in members), 30, "all stopped")
    stuck = m.status()["servers"][0]["in_flight"]
    down = m.wait(lambda s: s["servers"][0]["state"] == "down",
                  HEALTH["health_failures_to_down"] * (HEALTH["health_timeout_s"] + 5) + 60,
                  "the stopped server called down")
    t_down = time.time()
    assert down["servers"][0]["pid"] == pid and down["servers"][0]["restarts"] == restarts
    assert all(proc_state(p) == "T" for p in members), "down, yet not dead: hung"
    relaunched = m.wait(lambda s: s["servers"][0]["pid"] != pid, 120, "the hung server killed "
                        "and relaunched")
    new = relaunched["servers"][0]["pid"]
    assert relaunched["servers"][0]["restarts"] == restarts + 1
    assert not any(alive(p) for p in members) and group_members(pid) == []
    first_down = m.samples.first(t_stop, lambda s: s.server(0)["state"] == "down", 30,
                                 "down, sampled").t
    first_new = m.samples.first(t_stop, lambda s: s.server(0)["pid"] == new, 30,
                                "the relaunch, sampled").t
    assert first_new - first_down >= HEALTH["hung_restart_s"] - 1
    assert {s.server(0)["state"] for s in _live(m, t_stop, first_down)} <= \
        {"healthy", "degraded", "down"}
    log = m.supervisor_log()
    hung = next(line for line in _log_since(log, t_stop) if "is hung: SIGKILL" in line)
    assert all(str(p) in hung.split("(")[-1] for p in members), (hung, members)
    # The job ends with every index once on disk, its stuck requests sent elsewhere.
    done = m.wait(lambda s: s["status"] == "done", 420, "the run done")
    assert done["progress"]["completed"] == m.prompts
    verify = agent("verify", str(m.run_dir), timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    st = read_run(m.run_dir)
    assert st.todo == set() and not st.failed and len(st.current) == m.prompts
    after_stop = _done_order(done_file)[done_before:]
    new_healthy = [s.t for s in _live(m, t_stop) if s.server(0)["pid"] == new
                   and s.server(0)["state"] == "healthy"]
    # The relaunch loads for a minute or more: what was done after the stop went to server 1
    # (unless the new server 0 was up before the end).
    allowed = {0, 1} if new_healthy else {1}
    assert {st.current[i]["server"] for i in after_stop} <= allowed, after_stop
    recent = _log_since(m.supervisor_log(), t_stop)
    moved = {int(x.group(1)) for line in recent
             if (x := re.search(r"index (\d+) attempt \d+ on server 0: ", line))}
    hedged = {int(x.group(1)) for line in recent
              if (x := re.search(r"index (\d+) attempt \d+: hedged on server 1 ", line))}
    assert stuck >= 1 and moved | hedged, (stuck, recent[-20:])
    assert all(st.current[i]["server"] in allowed for i in moved | hedged)
    # The relaunch: a new real server, loading (not waited for: `down` stops it).
    assert alive(new) and cmdline(new).startswith(f"{m.env.python} -m sglang.launch_server")
    assert m.status()["servers"][0]["state"] in ("starting", "healthy")
    m.timings.update(hang_down_s=round(t_down - t_stop, 1),
                     hang_relaunch_s=round(first_new - t_stop, 1), hang_stuck=stuck,
                     hang_moved=len(moved | hedged), hang_after_stop=len(after_stop))


# ----- 7. down -----------------------------------------------------------------------------

def test_down_stops_every_process_of_the_run(managed: Managed,
                                             default_server: RealServer) -> None:
    m = managed
    sup = int((m.run_dir / "supervisor.pid").read_text())
    recs = [m.record(0), m.record(1)]
    assert all(alive(r["pid"]) for r in recs)
    r = agent("down", str(m.run_dir), "--yes", timeout=120)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: not alive(sup), 120, "the supervisor gone")
    for rec in recs:
        assert group_members(rec["pid"]) == [], f"server {rec['number']} left processes"
        assert not listening(rec["port"])
    default_server.wait_idle()  # the shared server is left as it was found
