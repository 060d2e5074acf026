"""The idle alert: a run done or stopped whose servers still hold the GPUs says so after
`idle_alert_s`, names the console actions that end it and what the wait costs; on a frozen
clock, and live on a supervised run."""

from __future__ import annotations

from typing import Any

from agents.rundir.schema import Cost, Progress, ServerStatus
from agents.rundir.spec import AlertsSection
from agents.supervise.alerts import AlertBook
from tests.plugins.supervised import agent, wait_status

CFG = AlertsSection(idle_alert_s=900)
END = 1_000_000.0  # when the run ended (progress.json's last write)


def progress(status: str, updated_at: float = END, price: float | None = 2.0) -> Progress:
    return Progress(total=100, completed=100, failed=0, rate_per_sec=0, eta_hours=0,
                    total_input_tokens=0, total_output_tokens=0, avg_output_tokens=0,
                    elapsed_hours=1, s3_uploaded=0, s3_bytes=0,
                    status=status,  # type: ignore[arg-type]
                    truncated=0, empty=0, max_tokens=4096, concurrency=8, in_flight=0,
                    retried=0, s3_pending=0, control_rev=1, updated_at=updated_at, servers={},
                    gpus=2, gpu_hours=2.0,
                    cost=Cost(price, 4.0, None, 4.0) if price is not None else None)


def servers(state: str = "healthy", ours: bool = True) -> list[ServerStatus]:
    return [ServerStatus(number=n, url=f"http://127.0.0.1:{30000 + n}", state=state,  # type: ignore[arg-type]
                         gpu=n, pid=4000 + n if ours else None) for n in range(2)]


def idle(alerts: list[Any]) -> Any:
    return next((a for a in alerts if a.code == "idle"), None)


def test_idle_gpus_after_the_run_ends_on_a_frozen_clock() -> None:
    book = AlertBook(CFG, host="gpu-box-7")
    assert idle(book.evaluate(progress("running"), servers(), None, now=END - 10)) is None
    # Done, servers up: quiet for idle_alert_s, then the alert, since the end.
    assert idle(book.evaluate(progress("done"), servers(), None, now=END + 60)) is None
    assert idle(book.evaluate(progress("done"), servers(), None, now=END + 899)) is None
    alert = idle(book.evaluate(progress("done"), servers(), None, now=END + 1800))
    assert alert is not None and alert.severity == "warning"
    assert alert.message.startswith("GPUs idle on gpu-box-7 — pull and decommission")
    assert alert.actions == ["pull", "decommission"]
    assert alert.since == END
    assert "30 min" in alert.message and "2 server(s)" in alert.message
    assert "$4.00/h: $2.00 so far" in alert.message  # 2 GPUs x $2/h x 30 min
    # The servers go down: it clears. Up again with the run over since END (progress.json
    # says so): it is back at once.
    assert idle(book.evaluate(progress("done"), servers("down"), None, now=END + 1900)) is None
    back = idle(book.evaluate(progress("done"), servers(), None, now=END + 1901))
    assert back is not None and back.since == END


def test_a_live_engine_stamps_every_snapshot_so_the_book_keeps_the_end() -> None:
    # With a live engine, progress.updated_at is always now: the end is when the book first
    # saw the run over.
    book = AlertBook(CFG, host="h")
    t = END
    assert idle(book.evaluate(progress("stopped", updated_at=t), servers(), None, now=t)) is None
    t += 901
    alert = idle(book.evaluate(progress("stopped", updated_at=t), servers(), None, now=t))
    assert alert is not None and alert.since == END and "stopped" in alert.message
    # Resumed: the alert clears at once.
    assert idle(book.evaluate(progress("running", updated_at=t), servers(), None, now=t)) is None


def test_no_idle_alert_for_servers_that_are_not_ours_or_a_running_run() -> None:
    book = AlertBook(CFG, host="h")
    later = END + 3600
    assert idle(book.evaluate(progress("done"), servers(ours=False), None, now=later)) is None
    assert idle(book.evaluate(progress("failed"), servers(), None, now=later)) is None
    assert idle(book.evaluate(None, servers(), None, now=later)) is None
    no_price = idle(AlertBook(CFG, host="h").evaluate(progress("done", price=None), servers(),
                                                      None, now=later))
    assert no_price is not None and "$" not in no_price.message


def test_live_idle_alert_on_a_finished_run(supervised: Any) -> None:
    run = supervised(1, prompts=60, alerts={"idle_alert_s": 2})
    run.spec.write_text(run.spec.read_text().replace(
        'name = "agent-test"', 'name = "agent-test"\ncost_per_gpu_hour = 2.5'))
    assert agent("up", str(run.spec)).returncode == 0
    snap = wait_status(run.run_dir, lambda s: any(a["code"] == "idle" for a in s["alerts"]),
                       120, "the idle alert after the run")
    alert = next(a for a in snap["alerts"] if a["code"] == "idle")
    assert snap["status"] == "done" and snap["servers"][0]["state"] == "healthy"
    assert alert["actions"] == ["pull", "decommission"]
    assert "pull and decommission" in alert["message"] and "$2.50/h" in alert["message"]
    assert snap["progress"]["cost"]["per_gpu_hour"] == 2.5
    # Taking the servers down ends it.
    assert agent("stop", str(run.run_dir), "--servers", "--yes").returncode == 0
    wait_status(run.run_dir, lambda s: not any(a["code"] == "idle" for a in s["alerts"]), 120,
                "the idle alert cleared")
