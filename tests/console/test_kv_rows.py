"""KV pressure on the console: the GPU row of a server that retracted requests says so (and
the status line `fleetdeck status` prints), the kv_pressure alert is listed with its advice,
and a row with no such figures (an older agent) reads as before."""

from __future__ import annotations

from typing import Any

import msgspec

from agents.rundir.schema import Snapshot
from console.headless import server_line
from console.tui.app import FleetdeckApp
from tests.console import data as d
from tests.console.screen import screen_text
from tests.console.test_gpu_groups_tui import SIZE, fleet, gpu_rows, opened

ADVICE = ("server 0 (GPU 0): KV cache full: 7 requests retracted in the last 5 min (token "
          "usage 97% of 3,072 tokens, 12 queued): lower concurrency or max_tokens")


def pressured(**first: Any) -> dict[str, Any]:
    servers = [d.server(0, **{"token_usage": 0.97, "queued_reqs": 12, "running_reqs": 40,
                              "kv_capacity_tokens": 3072, "kv_used_tokens": 2980,
                              "retracted_total": 31, "retracted_recent": 7, **first}),
               d.server(1)]
    p = d.progress()
    p["servers"] = {k: v for k, v in p["servers"].items() if k in ("0", "1")}
    alerts = [{"code": "kv_pressure:0", "severity": "warning", "message": ADVICE,
               "since": d.NOW - 30, "server": 0}]
    return d.generate_snapshot(servers=servers, progress=p, alerts=alerts)


async def test_the_row_of_a_retracting_server_says_so_and_the_alert_says_what_to_do() -> None:
    app = FleetdeckApp(fleet(), connect=False, clock=lambda: d.NOW)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, app, pressured())
        first, second = gpu_rows(app)
        assert first.split()[:4] == ["0", "healthy,", "7", "retracted"], first
        assert "retracted" not in second, second
        text = screen_text(app)
        assert "lower concurrency or max_tokens" in text, text


def test_the_status_line_names_the_pool_and_the_retractions() -> None:
    snap = msgspec.convert(pressured(), Snapshot)
    line = server_line(snap.servers[0])
    assert "KV 97% of 3,072" in line and "7 retracted recently (31 since it started)" in line
    calm = server_line(snap.servers[1])  # figures an older agent does not send: as before
    assert "retracted" not in calm and "KV –" in calm, calm
