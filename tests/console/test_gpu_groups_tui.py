"""The TUI's GPU rows for servers that span GPUs: each row names its group (`0-1`), its GPU
figures are the group's as the node sent them, the restart confirmation names the group, a
snapshot from before groups (`gpu` alone) still reads, and a group a node could not have sent
(a negative id, an empty or huge group) makes the snapshot unreadable, not the screen."""

from __future__ import annotations

from typing import Any

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.node import GenerateScreen
from console.tui.widgets.confirm import ConfirmModal
from tests.console import data as d
from tests.console.conftest import on_screen, until
from tests.console.screen import screen_text

SIZE = (160, 48)
# Two servers of two GPUs each, NVML figures summed over the group by the agent.
STATS = {"util_pct": 88.0, "mem_used_mib": 2 * 170_000.0, "mem_total_mib": 2 * 183_359.0,
         "temp_c": 66.0, "power_w": 1_810.0}


def fleet() -> Fleet:
    return Fleet(nodes=[Node(name="gen-1", run_dir="/r", host="gpu-box-7")],
                 console=ConsoleSettings(bell=False), source="fleet.toml")


def grouped(**first: Any) -> dict[str, Any]:
    servers = [d.server(0, gpu=0, **{"gpus": [0, 1], "gpu_stats": STATS, **first}),
               d.server(1, gpu=2, gpus=[2, 3], gpu_stats=STATS)]
    p = d.progress(gpus=4)
    p["servers"] = {k: v for k, v in p["servers"].items() if k in ("0", "1")}
    return d.generate_snapshot(servers=servers, progress=p, alerts=[])


def gpu_rows(app: FleetdeckApp) -> list[str]:
    """The screen's lines that are GPU table rows (they end with the power column)."""
    return [line for line in screen_text(app).splitlines() if " W" in line and "°C" in line]


async def opened(pilot: Any, app: FleetdeckApp, snap: dict[str, Any]) -> GenerateScreen:
    app.ingest("gen-1", snap)
    app.state.set_link("gen-1", "connected", None)
    app.redraw()
    await pilot.pause()
    await pilot.press("enter")
    screen = await until(pilot, lambda: on_screen(app, GenerateScreen), 60, "the node screen")
    app.redraw()
    await until(pilot, lambda: len(gpu_rows(app)) == 2, 60, "two GPU rows")
    return screen


async def test_each_row_names_its_group_and_restart_asks_about_it() -> None:
    app = FleetdeckApp(fleet(), connect=False, clock=lambda: d.NOW)
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, app, grouped())
        first, second = gpu_rows(app)
        assert first.split()[:2] == ["0-1", "healthy"], first
        assert second.split()[:2] == ["2-3", "healthy"], second
        # The group's memory as sent (two GPUs' worth), its mean utilisation, summed power.
        assert "332.0/358 GiB" in first and "88%" in first and "1810 W" in first, first
        screen.gpu_table.focus()
        await pilot.press("down")
        await pilot.press("x")
        modal = await until(pilot, lambda: on_screen(app, ConfirmModal), 60,
                            "the restart confirmation")
        assert "Restart server 1 (GPU 2-3) on gen-1?" in modal.question
        await pilot.press("n")


async def test_a_snapshot_from_before_groups_shows_its_one_gpu() -> None:
    app = FleetdeckApp(fleet(), connect=False, clock=lambda: d.NOW)
    old = grouped()
    for s in old["servers"]:
        del s["gpus"]
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, app, old)
        assert [row.split()[0] for row in gpu_rows(app)] == ["0", "2"]


async def test_a_group_no_node_could_send_is_an_unreadable_snapshot() -> None:
    app = FleetdeckApp(fleet(), connect=False, clock=lambda: d.NOW)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, app, grouped())
        for bad, why in (([0, -1], "gpus[1]"), ([], "length >= 1"),
                         (list(range(300)), "length <= 256"), (["0"], "got `str`")):
            app.ingest("gen-1", grouped(gpus=bad))
            error = app.state.nodes["gen-1"].error or ""
            assert "unreadable snapshot" in error and why in error, error
            app.redraw()
            await pilot.pause()
            # The last good snapshot stays on screen; the app keeps running.
            assert [row.split()[0] for row in gpu_rows(app)] == ["0-1", "2-3"]
