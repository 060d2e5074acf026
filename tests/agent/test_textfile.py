"""The Prometheus textfile is what prometheus_client's own parser reads back: every metric
typed once, labels escaped (a run name with quotes, a newline), values as given."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agents.rundir.schema import Alert, PagerStatus, Progress, ServerStatus, Snapshot
from agents.supervise.textfile import render, write
from tests.agent.test_alerts import progress


def _with_loops(p: Progress) -> Progress:
    p.truncated, p.truncated_loops = 30, 21
    return p


def snapshot() -> Snapshot:
    servers = [ServerStatus(number=0, url="http://127.0.0.1:30000", state="healthy", gpu=0,
                            gpus=[0, 1], req_per_s=2.5, tok_per_s=900.0, completed=120,
                            accept_length_window=3.25, token_usage=0.5, queued_reqs=3),
               ServerStatus(number=1, url="http://127.0.0.1:30002", state="down", gpu=2,
                            gpus=[2], restarts=4)]
    alerts = [Alert(code="server_down:1", severity="critical", message="down", since=1.0,
                    server=1),
              Alert(code="stall", severity="critical", message="quiet", since=2.0)]
    return Snapshot(kind="generate", run='qwen "big"\nrun\\x', run_dir="/data/r",
                    host="box", status="running", updated_at=10.0, source="supervisor",
                    progress=_with_loops(progress(400)), servers=servers, alerts=alerts,
                    pager=PagerStatus(format="slack", posted=2, dropped=1, pending=3))


def test_the_textfile_parses_with_prometheus_client(tmp_path: Path) -> None:
    path = tmp_path / "fleetdeck.prom"
    write(path, render(snapshot(), now=1234.5))
    assert os.listdir(tmp_path) == ["fleetdeck.prom"]  # the temp file renamed, none left
    fams = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    info = fams["fleetdeck_run_info"].samples[0]
    assert info.labels["run"] == 'qwen "big"\nrun\\x' and info.labels["status"] == "running"
    assert fams["fleetdeck_run_completed"].samples[0].value == 400
    assert fams["fleetdeck_run_progress_ratio"].samples[0].value == 0.04
    assert fams["fleetdeck_run_eta_seconds"].samples[0].value == 3600
    assert fams["fleetdeck_run_truncated"].samples[0].value == 30
    assert fams["fleetdeck_run_truncated_loops"].samples[0].value == 21
    up = {s.labels["server"]: (s.labels["gpus"], s.value)
          for s in fams["fleetdeck_server_up"].samples}
    assert up == {"0": ("0-1", 1.0), "1": ("2", 0.0)}
    assert [s.value for s in fams["fleetdeck_server_accept_length"].samples] == [3.25]
    assert [s.value for s in fams["fleetdeck_server_queued"].samples] == [3]  # none: no row
    assert {s.labels["code"] for s in fams["fleetdeck_alert"].samples} == {
        "server_down:1", "stall"}
    assert fams["fleetdeck_alerts_active"].samples[0].value == 2
    assert fams["fleetdeck_pages_dropped"].samples[0].value == 1
    assert fams["fleetdeck_textfile_updated_timestamp_seconds"].samples[0].value == 1234.5
    assert all(f.type == "gauge" and f.name.startswith("fleetdeck_") for f in fams.values())
