"""Alerts are raised with a reason and since when, and clear when their condition does."""

from __future__ import annotations

import httpx

from agents.rundir.schema import DiskStatus, Progress, ServerProgress, ServerStatus
from agents.rundir.spec import AlertsSection
from agents.supervise.alerts import AlertBook
from tests.plugins.supervised import agent, wait_status

CFG = AlertsSection(window_s=60, stall_minutes=1, failure_rate=0.05, truncation_rate=0.1,
                    empty_rate=0.05, min_samples=20, disk_hours=6)


def progress(completed: int, failed: int = 0, truncated: int = 0, empty: int = 0,
             in_flight: int = 4, status: str = "running", accept: float = 3.0) -> Progress:
    server = ServerProgress(url="http://x", state="healthy", in_flight=in_flight, limit=8,
                            completed=completed, failed=failed, req_per_s=1, tok_per_s=1,
                            accept_length=accept)
    return Progress(total=10_000, completed=completed, failed=failed, rate_per_sec=1,
                    eta_hours=1, total_input_tokens=0, total_output_tokens=0,
                    avg_output_tokens=0, elapsed_hours=0, s3_uploaded=0, s3_bytes=0,
                    status=status, truncated=truncated, empty=empty,  # type: ignore[arg-type]
                    max_tokens=4096, concurrency=8, in_flight=in_flight, retried=0,
                    s3_pending=0, control_rev=1, updated_at=0, servers={"0": server})


def codes(alerts) -> set[str]:
    return {a.code for a in alerts}


def test_stall_raised_after_quiet_minutes_and_cleared_by_a_completion() -> None:
    book = AlertBook(CFG)
    assert codes(book.evaluate(progress(100), [], None, now=0)) == set()
    assert "stall" not in codes(book.evaluate(progress(100), [], None, now=30))
    alerts = book.evaluate(progress(100), [], None, now=61)
    assert {"stall", "stall:0"} <= codes(alerts)
    since = next(a.since for a in alerts if a.code == "stall")
    assert next(a.since for a in book.evaluate(progress(100), [], None, now=70)
                if a.code == "stall") == since
    assert "stall" not in codes(book.evaluate(progress(101), [], None, now=71))
    # A paused run is quiet on purpose.
    paused = progress(101)
    paused.paused = True
    assert "stall" not in codes(book.evaluate(paused, [], None, now=200))


def test_failure_spike_in_the_window_not_the_lifetime() -> None:
    book = AlertBook(CFG)
    book.evaluate(progress(1000, failed=0), [], None, now=0)
    alerts = book.evaluate(progress(1080, failed=20), [], None, now=30)
    assert "failure_rate" in codes(alerts)
    assert "20.0%" in next(a.message for a in alerts if a.code == "failure_rate")
    # The window moves on: the spike is over once it has left the window.
    book.evaluate(progress(1200, failed=20), [], None, now=70)
    assert "failure_rate" not in codes(book.evaluate(progress(1400, failed=20), [], None,
                                                     now=140))


def test_empty_and_truncated_answers() -> None:
    book = AlertBook(CFG)
    book.evaluate(progress(0), [], None, now=0)
    alerts = book.evaluate(progress(100, empty=30, truncated=25), [], None, now=10)
    assert {"empty_rate", "truncation_rate"} <= codes(alerts)
    assert "consider raising max_tokens" in next(a.message for a in alerts
                                                 if a.code == "truncation_rate")
    book.evaluate(progress(200, empty=30, truncated=25), [], None, now=65)
    assert not {"empty_rate", "truncation_rate"} & codes(
        book.evaluate(progress(400, empty=30, truncated=25), [], None, now=130))


def test_over_cap_server_down_accept_drop_and_disk() -> None:
    book = AlertBook(CFG)
    server = ServerStatus(number=0, url="http://x", state="healthy", gpu=0, limit=64,
                          effective_max_running=48, accept_length_window=1.2)
    disk = DiskStatus(path="/data", free_bytes=10 * 2**30, total_bytes=100 * 2**30,
                      hours_to_full=2.5)
    alerts = book.evaluate(progress(10, accept=3.0), [server], disk, now=0)
    assert {"over_cap:0", "accept_drop:0", "disk_full"} <= codes(alerts)
    down = ServerStatus(number=0, url="http://x", state="down", gpu=0, limit=48,
                        effective_max_running=48, last_error="process 7 exited")
    alerts = book.evaluate(progress(10), [down], None, now=1)
    assert codes(alerts) & {"over_cap:0", "disk_full", "accept_drop:0"} == set()
    assert "process 7 exited" in next(a.message for a in alerts if a.code == "server_down:0")


def test_live_over_cap_and_empty_alerts_raise_and_clear(supervised) -> None:
    run = supervised(1, prompts=5000, sim_args="--time-scale 0.3 --max-running-requests 4 "
                     "--empty-rate 0.5 --truncation-share 0", concurrency_per_server=8,
                     alerts={"window_s": 3, "min_samples": 10})
    assert agent("up", str(run.spec)).returncode == 0
    snap = wait_status(run.run_dir, lambda s: {"over_cap:0", "empty_rate"} <= {
        a["code"] for a in s["alerts"]}, 120, "over-cap and empty alerts")
    url = snap["servers"][0]["url"]
    assert agent("resize", str(run.run_dir), "4").returncode == 0
    httpx.post(f"{url}/sim/faults", json={"empty_rate": 0.0}, timeout=60).raise_for_status()
    wait_status(run.run_dir, lambda s: not {"over_cap:0", "empty_rate"} & {
        a["code"] for a in s["alerts"]}, 120, "both cleared")


def test_disk_projection_waits_for_minutes_of_samples(tmp_path) -> None:
    from agents.supervise.snapshot import DiskWatch

    watch = DiskWatch(tmp_path, window_s=600, min_span_s=300)
    first = watch.status(now=1000.0)
    assert first is not None and first.hours_to_full is None
    # Pretend 1 GiB was written in the next 10 s: too short a span to project from.
    watch._samples[0] = (1000.0, first.free_bytes + 2**30)
    assert watch.status(now=1010.0).hours_to_full is None
    later = watch.status(now=1400.0)
    assert later.hours_to_full is not None and later.hours_to_full > 0


def test_truncation_names_the_limit_answers_ran_with_not_only_todays() -> None:
    """Raised from 4096 to 8192: answers cut at 4096 still arrive for a while, and the alert
    must not say they hit 8192; once only 8192 answers are in view it names 8192 alone."""
    def at(limit: int, completed: int, truncated: int):
        p = progress(completed, truncated=truncated)
        p.max_tokens = limit
        return p

    book = AlertBook(CFG)
    book.evaluate(at(4096, 0, 0), [], None, now=0)
    alerts = book.evaluate(at(4096, 100, 18), [], None, now=30)
    assert next(a.message for a in alerts if a.code == "truncation_rate") == (
        "18.0% of recent answers hit max_tokens 4096: consider raising max_tokens")
    alerts = book.evaluate(at(8192, 200, 35), [], None, now=59)
    message = next(a.message for a in alerts if a.code == "truncation_rate")
    assert "hit max_tokens 8192" not in message
    assert "(4096 until " in message and "8192 since)" in message
    assert "run again at 8192 (retry truncated)" in message
    # Two windows on, every answer in view ran under 8192: truncated ones hit 8192.
    assert "truncation_rate" not in codes(book.evaluate(at(8192, 300, 40), [], None, now=130))
    book.evaluate(at(8192, 400, 45), [], None, now=190)
    alerts = book.evaluate(at(8192, 500, 60), [], None, now=250)
    assert next(a.message for a in alerts if a.code == "truncation_rate") == (
        "15.0% of recent answers hit max_tokens 8192: consider raising max_tokens")


def test_truncation_is_judged_against_the_limit_each_answer_ran_with() -> None:
    """From an engine that counts answers per max_tokens: after a raise from 4096 to 8192,
    late answers cut at 4096 do not raise the alert at 8192; answers cut at 8192 do."""
    def at(limit: int, by: dict[int, tuple[int, int]]):
        answers = sum(a for a, _ in by.values())
        p = progress(answers, truncated=sum(t for _, t in by.values()))
        p.max_tokens = limit
        p.answers_by_limit = {str(k): a for k, (a, _) in by.items()}
        p.truncated_by_limit = {str(k): t for k, (_, t) in by.items()}
        return p

    book = AlertBook(CFG)
    book.evaluate(at(4096, {4096: (0, 0)}), [], None, now=0)
    alerts = book.evaluate(at(4096, {4096: (100, 18)}), [], None, now=30)
    assert next(a.message for a in alerts if a.code == "truncation_rate") == (
        "18.0% of the last 100 answers at max_tokens 4096 hit it: consider raising max_tokens")
    # Raised: 60 late answers cut at 4096 and 100 at 8192 of which 2 cut; 80 cut of 260
    # overall would be 31%, but at today's limit it is 2%.
    late = {4096: (160, 78), 8192: (100, 2)}
    assert "truncation_rate" not in codes(book.evaluate(at(8192, late), [], None, now=59))
    # Answers at 8192 that are cut do raise it, naming 8192.
    worse = {4096: (160, 78), 8192: (200, 40)}
    alerts = book.evaluate(at(8192, worse), [], None, now=80)
    message = next(a.message for a in alerts if a.code == "truncation_rate")
    assert "at max_tokens 8192" in message and "4096" not in message


def test_truncation_advice_tells_loops_from_long_answers() -> None:
    """Loops gain nothing from more tokens: the advice names the split and sends only the
    long ones back; when every cut answer in the window is a loop it says not to retry."""
    def at(answers: int, cut: int, loops: int):
        p = progress(answers, truncated=cut)
        p.answers_by_limit = {"4096": answers}
        p.truncated_by_limit = {"4096": cut}
        p.truncated_loops = loops
        return p

    book = AlertBook(CFG)
    book.evaluate(at(0, 0, 0), [], None, now=0)
    alerts = book.evaluate(at(100, 20, 15), [], None, now=30)
    message = next(a.message for a in alerts if a.code == "truncation_rate")
    assert "(15 of 20 cut are loops, 5 long)" in message
    assert "retry truncated --long-only" in message

    book = AlertBook(CFG)
    book.evaluate(at(0, 0, 0), [], None, now=0)
    alerts = book.evaluate(at(100, 20, 20), [], None, now=30)
    message = next(a.message for a in alerts if a.code == "truncation_rate")
    assert "(20 of 20 cut are loops, 0 long)" in message
    assert "--long-only" not in message and "instead of retrying" in message
