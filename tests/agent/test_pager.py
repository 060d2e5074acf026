"""Pages from the node: against a real HTTP receiver on loopback that is down for a while,
pages are retried, none lost within the queue's bound, the rest counted dropped, and at most
`per_minute` posts go (the last one a summary of everything waiting). End to end: a real
supervised run pages its alert and the clearing with no console, and writes the textfile that
prometheus_client's own parser reads."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.rundir.schema import Alert
from agents.supervise.pager import Pager
from console.localproc import free_ports, wait_until
from tests.plugins.supervised import agent, wait_status

SECRET_PATH = "/hooks/T0/SEKRIT-hook-4711"
LINE = re.compile(r"^:\w+: (RAISED|CLEARED) (\S+) ", re.M)


class Receiver:
    """A webhook receiver on 127.0.0.1:port, started late (the port refuses until then),
    answering `fail_first` posts with 503 before it takes any."""

    def __init__(self, port: int, fail_first: int = 0) -> None:
        self.port = port
        self.fail_first = fail_first
        self.posts: list[tuple[dict[str, str], bytes]] = []  # the ones answered 200
        self.refused = 0
        self.lock = threading.Lock()
        self.server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    ok = receiver.refused >= receiver.fail_first and self.path == SECRET_PATH
                    if ok:
                        receiver.posts.append((dict(self.headers), body))
                    else:
                        receiver.refused += 1
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def changes(self) -> list[tuple[str, str]]:
        with self.lock:
            texts = [json.loads(b)["text"] if b.startswith(b"{") else b.decode()
                     for _, b in self.posts]
        return [(m[0], m[1]) for t in texts for m in LINE.findall(t)]

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class LoopThread:
    """The pager in its own event loop (as in the supervisor), driven from the test."""

    def __init__(self, pager: Pager) -> None:
        self.pager = pager
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[None] | None = None
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.task = asyncio.ensure_future(self.pager.run())

    def observe(self, codes: list[str], now: float) -> list[Alert]:
        alerts = [Alert(code=c, severity="critical" if c.startswith("server_down") else
                        "warning", message=f"{c} is wrong", since=now) for c in codes]

        async def go() -> None:
            self.pager.observe(alerts, now)
        asyncio.run_coroutine_threadsafe(go(), self.loop).result(10)
        return alerts

    def close(self) -> None:
        async def stop() -> None:
            assert self.task is not None
            self.task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for r in made:
        r.stop()


def pager_for(port: int, **kw: Any) -> Pager:
    return Pager(f"http://127.0.0.1:{port}{SECRET_PATH}", kw.pop("fmt", "slack"), "box/run",
                 backoff_s=0.05, backoff_max_s=0.2, timeout_s=5, **kw)


def test_receiver_down_for_a_while_nothing_lost_and_rate_limited(port: int, receivers) -> None:
    receiver = Receiver(port, fail_first=2)
    receivers.append(receiver)
    lt = LoopThread(pager_for(port, per_minute=3, queue_max=50))
    try:
        # Five alerts raise, two of them clear, one more raises: 8 changes, all while the
        # port refuses connections.
        marked = lt.observe(["a", "b", "c", "d", "server_down:0"], 100.0)
        assert all(a.paged for a in marked)  # the console will not page these again
        lt.observe(["c", "d", "server_down:0"], 101.0)
        lt.observe(["c", "d", "server_down:0", "e"], 102.0)
        wait_until(lambda: lt.pager.status.failures >= 3, 30, "retries while down")
        st = lt.pager.snapshot()
        assert st.posted == 0 and st.pending == 8 and st.dropped == 0
        assert st.last_error is not None and "retrying" in st.last_error
        assert "SEKRIT" not in json.dumps(msgspec.to_builtins(st))
        assert "SEKRIT" not in (st.last_error or "")
        # Up, but answering 503 twice: retried again; then it takes them.
        receiver.start()
        wait_until(lambda: lt.pager.status.pending == 0, 30, "every page posted")
        st = lt.pager.snapshot()
        want = {("RAISED", c) for c in ("a", "b", "c", "d", "e", "server_down:0")} | {
            ("CLEARED", "a"), ("CLEARED", "b")}
        got = receiver.changes()
        assert sorted(got) == sorted(want)  # each change once, none lost
        assert receiver.refused == 2 and st.failures >= 5
        # Rate limited: 3 posts a minute reach the receiver, the two it refused included;
        # the third, the last the minute allows, carries all eight as one summary.
        assert len(receiver.posts) == 1 == st.posted and st.pages == 8 and st.dropped == 0
        last = json.loads(receiver.posts[-1][1])["text"]
        assert "8 alert changes" in last and "summary" in last
        assert got[:2] == [("RAISED", "a"), ("RAISED", "b")]  # in the order they came
        # A ninth change waits for the minute to pass: no fourth post now.
        lt.observe(["c", "d", "server_down:0"], 103.0)
        wait_until(lambda: lt.pager.status.pending == 1, 10, "queued behind the limit")
        assert len(receiver.posts) + receiver.refused == 3
    finally:
        lt.close()


def test_a_burst_goes_as_the_limit_allows_the_rest_in_one_summary(port: int,
                                                                  receivers) -> None:
    receiver = Receiver(port)
    receivers.append(receiver)
    receiver.start()
    lt = LoopThread(pager_for(port, per_minute=3, queue_max=50))
    try:
        codes = [f"stall:{n}" for n in range(8)]
        lt.observe(codes, 100.0)
        wait_until(lambda: lt.pager.status.pending == 0, 30, "the burst posted")
        texts = [json.loads(b)["text"] for _, b in receiver.posts]
        assert len(texts) == 3 and lt.pager.status.posted == 3
        assert texts[0].startswith(":warning: RAISED stall:0 ") and "summary" not in texts[1]
        assert "6 alert changes" in texts[2] and "summary" in texts[2]
        assert sorted(receiver.changes()) == sorted(("RAISED", c) for c in codes)
    finally:
        lt.close()


def test_past_the_bound_the_oldest_are_dropped_and_counted(port: int, receivers) -> None:
    receiver = Receiver(port)
    receivers.append(receiver)
    lt = LoopThread(pager_for(port, per_minute=60, queue_max=3))
    try:
        lt.observe(["a", "b", "c", "d", "e"], 100.0)
        st = lt.pager.snapshot()
        assert st.dropped == 2 and st.pending == 3
        receiver.start()
        wait_until(lambda: lt.pager.status.pending == 0, 30, "the rest posted")
        assert sorted(receiver.changes()) == [("RAISED", c) for c in ("c", "d", "e")]
        assert lt.pager.status.dropped == 2
    finally:
        lt.close()


def test_ntfy_gets_a_plain_body_with_title_and_priority(port: int, receivers) -> None:
    receiver = Receiver(port)
    receivers.append(receiver)
    receiver.start()
    lt = LoopThread(pager_for(port, fmt="ntfy"))
    try:
        lt.observe(["server_down:0"], 100.0)
        wait_until(lambda: len(receiver.posts) == 1, 30, "one post")
        headers, body = receiver.posts[0]
        assert body.decode().startswith(":rotating_light: RAISED server_down:0 [critical]")
        assert headers["Priority"] == "urgent" and "server_down:0" in headers["Title"]
        assert headers["Content-Type"].startswith("text/plain")
    finally:
        lt.close()


def test_a_supervised_run_pages_and_clears_with_no_console_and_exports(
        supervised, tmp_path: Path, port: int, receivers) -> None:
    receiver = Receiver(port)  # down until the alert has been tried
    receivers.append(receiver)
    prom = tmp_path / "textfile" / "fleetdeck.prom"
    prom.parent.mkdir()
    run = supervised(1, prompts=5000, sim_args="--time-scale 0.3 --empty-rate 0.5 "
                     "--truncation-share 0",
                     alerts={"window_s": 3, "min_samples": 10,
                             "webhook": f"http://127.0.0.1:{port}{SECRET_PATH}",
                             "prometheus_textfile": str(prom)})
    assert agent("up", str(run.spec)).returncode == 0
    down = wait_status(run.run_dir, lambda s: s["pager"]["failures"] >= 1, 120,
                       "the page tried while the receiver is down")
    assert down["pager"]["pending"] >= 1 and down["pager"]["posted"] == 0
    receiver.start()
    # Nobody subscribes: the page comes from the node alone.
    wait_until(lambda: ("RAISED", "empty_rate") in receiver.changes(), 120, "the page")
    snap = wait_status(run.run_dir, lambda s: any(a["code"] == "empty_rate" for a in s["alerts"]),
                       60, "the alert in status")
    assert all(a["paged"] for a in snap["alerts"])
    assert snap["pager"]["posted"] >= 1 and snap["pager"]["format"] == "slack"
    assert "SEKRIT" not in json.dumps(snap)

    def families() -> dict[str, Any]:
        try:
            text = prom.read_text()
        except FileNotFoundError:
            return {}
        return {f.name: f for f in text_string_to_metric_families(text)}

    def alert_exported() -> bool:
        fam = families().get("fleetdeck_alert")
        return fam is not None and any(s.labels["code"] == "empty_rate" for s in fam.samples)

    wait_until(alert_exported, 60, "the alert in the textfile")
    fams = families()
    completed = fams["fleetdeck_run_completed"].samples[0]
    assert completed.labels["run"] == "agent-test" and completed.value > 0
    up = fams["fleetdeck_server_up"].samples[0]
    assert up.labels["server"] == "0" and up.labels["gpus"] == "0" and up.value == 1
    assert fams["fleetdeck_server_requests_per_second"].samples[0].value >= 0
    assert fams["fleetdeck_pages_posted"].samples[0].value >= 1
    assert not [p for p in prom.parent.iterdir() if p.name != prom.name]  # no temp left

    url = snap["servers"][0]["url"]
    httpx.post(f"{url}/sim/faults", json={"empty_rate": 0.0}, timeout=60).raise_for_status()
    wait_until(lambda: ("CLEARED", "empty_rate") in receiver.changes(), 120, "the clearing")
    assert receiver.changes().count(("RAISED", "empty_rate")) == 1  # paged once
    # The URL's secret part is in no file of the run but secrets.json: logs, copy, state.
    leaks = [str(f) for f in run.run_dir.rglob("*") if f.is_file() and not f.is_symlink()
             and f.name != "secrets.json" and b"SEKRIT" in f.read_bytes()]
    assert leaks == []
    assert "webhook" in (run.run_dir / "logs" / "supervisor.log").read_text()  # it did log
    # Down: the textfile keeps the run's last word, servers down, written after they stopped.
    written = fams["fleetdeck_textfile_updated_timestamp_seconds"].samples[0].value
    assert agent("down", str(run.run_dir), "--yes").returncode == 0
    wait_until(lambda: not (run.run_dir / "supervisor.pid").exists(), 120, "supervisor gone")
    last = families()
    assert last["fleetdeck_textfile_updated_timestamp_seconds"].samples[0].value > written
    assert [s.value for s in last["fleetdeck_server_up"].samples] == [0]
    assert not [c for c in receiver.changes() if c[1].startswith("server_down")]  # no page


def test_a_receiver_that_never_answers_holds_up_neither_status_nor_the_run(
        supervised, port: int) -> None:
    """A webhook that takes the connection and says nothing (a hung proxy): the post waits
    out its timeout in the pager's task while status answers at once and the run goes on."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", port))
    hung.listen(16)  # connections complete in the kernel's backlog; nobody reads them
    try:
        run = supervised(1, prompts=5000, sim_args="--time-scale 0.3 --empty-rate 0.5 "
                         "--truncation-share 0",
                         alerts={"window_s": 3, "min_samples": 10,
                                 "webhook": f"http://127.0.0.1:{port}{SECRET_PATH}"})
        assert agent("up", str(run.spec)).returncode == 0
        first = wait_status(run.run_dir, lambda s: s["pager"]["pending"] >= 1, 120,
                            "a page waiting on the hung receiver")
        assert first["pager"]["posted"] == 0
        took = []
        for _ in range(10):
            t0 = time.monotonic()
            snap = wait_status(run.run_dir, lambda s: True, 10, "status")
            took.append(time.monotonic() - t0)
            assert snap["pager"]["posted"] == 0
        assert max(took) < 5.0, took  # a post on the loop would hold it its 10 s timeout
        later = wait_status(run.run_dir, lambda s: s["progress"]["completed"] >
                            first["progress"]["completed"] + 50, 60, "the run going on")
        assert later["servers"][0]["state"] == "healthy" and later["pager"]["posted"] == 0
    finally:
        hung.close()
