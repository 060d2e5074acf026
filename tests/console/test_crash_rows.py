"""A server that cannot start, on the console: its GPU row says why its process exited (`gave
up: ...` once the supervisor stopped restarting it), the run panel and `fleetdeck status`
give the log's line, and what the node sent is shown escaped, never obeyed."""

from __future__ import annotations

from typing import Any

import msgspec

from agents.rundir.schema import ServerStatus, Snapshot
from console.headless import server_line
from console.tui.app import FleetdeckApp
from console.tui.widgets.gpu_table import exit_cause
from tests.console import data as d
from tests.console.conftest import until
from tests.console.screen import screen_text
from tests.console.test_gpu_groups_tui import SIZE, fleet, gpu_rows, opened

OOM = ("process 4242 exited with 1 at start-up: out of memory: torch.OutOfMemoryError: CUDA "
       "out of memory. Tried to allocate 1.16 GiB.")
# A node may send anything: an escape sequence that would retitle the terminal.
STOPPED = ("restarts stopped: the same unknown argument at start-up twice in a row (sglang "
           "serve: error: unrecognized arguments: --enable-metrcs\x1b]0;pwned\x07): fix "
           "[servers] command in run.toml")


def crashing() -> dict[str, Any]:
    servers = [d.server(0, "down", exit_cause="out_of_memory", last_error=OOM, restarts=3),
               d.server(1, "down", exit_cause="unknown_argument", restarts_stopped=STOPPED[18:],
                        last_error=STOPPED, restarts=1)]
    p = d.progress()
    p["servers"] = {k: v for k, v in p["servers"].items() if k in ("0", "1")}
    alerts = [{"code": f"server_down:{s['number']}", "severity": "critical",
               "message": f"server {s['number']} (GPU {s['number']}) is down: {s['last_error']}",
               "since": d.NOW - 30, "server": s["number"]} for s in servers]
    return d.generate_snapshot(servers=servers, progress=p, alerts=alerts)


async def test_the_rows_say_why_and_the_panel_gives_the_line() -> None:
    app = FleetdeckApp(fleet(), connect=False, clock=lambda: d.NOW)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, app, crashing())
        first, second = gpu_rows(app)
        assert first.split()[:5] == ["0", "down:", "out", "of", "memory"], first
        assert second.split()[:4] == ["1", "gave", "up:", "unknown"], second
        text = screen_text(app)
        assert "torch.OutOfMemoryError: CUDA out of memory" in text, text
        assert "\x1b" not in text and "\x07" not in text
        assert "--enable-metrcs\\x1b]0;pwned\\x07" in text, text
        # Started again: the last exit's cause no longer names the state (the panel keeps it).
        again = crashing()
        again["servers"][0]["state"] = "starting"
        again["updated_at"] = d.NOW + 1
        app.ingest("gen-1", again)
        app.redraw()
        await until(pilot, lambda: gpu_rows(app)[0].split()[:2] == ["0", "starting"], 60,
                    "server 0 starting")
        assert gpu_rows(app)[0].split()[2] == "3", gpu_rows(app)[0]  # then its restarts


def test_the_status_lines_give_the_cause_of_a_server_not_up() -> None:
    snap = msgspec.convert(crashing(), Snapshot)
    oom, stopped = (server_line(s) for s in snap.servers)
    assert oom.splitlines()[1].strip() == OOM
    assert stopped.splitlines()[1].strip().startswith("restarts stopped: the same unknown")
    assert "\\x1b]0;pwned\\x07" in stopped and "\x1b" not in stopped
    healthy = server_line(msgspec.convert(d.server(2), ServerStatus))
    assert "\n" not in healthy  # a server that is up: one line, as before


def test_a_cause_this_console_does_not_know_is_shown_as_sent_escaped() -> None:
    row = msgspec.convert(d.server(0, "down", exit_cause="gpu_fell_off_the_bus\x1b[2J"),
                          ServerStatus)
    assert exit_cause(row) == "gpu_fell_off_the_bus\\x1b[2J"
    assert exit_cause(msgspec.convert(d.server(0, "down", exit_cause="missing_model"),
                                      ServerStatus)) == "no model"
