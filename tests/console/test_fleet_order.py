"""The fleet table at a big fleet's size, through the real TUI: sorted by a column (numbers as
numbers, the order following the figures as they change, the cursor on its node), filtered
by name, state or alert, and reset with escape; also under --read-only and remapped keys."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from console.fleet import ConsoleSettings, Fleet, Node
from console.tui.app import FleetdeckApp
from console.tui.screens.fleet import FleetScreen
from console.tui.widgets.fleet_table import FleetTable
from console.tui.widgets.live_static import LiveStatic
from tests.console import data as d
from tests.console.conftest import on_screen, until

NODES = 24
SIZE = (160, 20)  # fewer lines than nodes: some rows are out of view, built lazily
# Rates that sort differently as words ("10.0" < "9.5") and as numbers.
RATES = [9.5, 10.0, 100.0, 2.25, 33.0, 0.5]


def big_fleet(**console: Any) -> Fleet:
    return Fleet(nodes=[Node(name=f"gen-{i:02d}", run_dir="/data/runs/r", host=f"box-{i}")
                        for i in range(1, NODES + 1)],
                 console=ConsoleSettings(bell=False, **console), source="fleet.toml")


def snapshot(i: int, rate: float | None = None, failed: int = 0,
             status: str = "running") -> dict[str, Any]:
    rate = RATES[i % len(RATES)] + i / 1000 if rate is None else rate
    alerts = [{"code": "server_oom", "severity": "critical", "message": "server 2 out of memory",
               "since": d.NOW - 60}] if i % 7 == 0 else []
    return d.generate_snapshot(status=status, alerts=alerts, progress=d.progress(
        completed=1000 * i, total=100_000, rate_per_sec=rate, failed=failed, status=status))


async def fed(pilot: Any, **over: dict[str, Any]) -> FleetTable:
    app: FleetdeckApp = pilot.app
    await until(pilot, lambda: on_screen(app, FleetScreen), 60, "the fleet screen")
    for i in range(1, NODES + 1):
        name = f"gen-{i:02d}"
        app.ingest(name, over.get(name) or snapshot(i))
        app.state.set_link(name, "connected", None)
        app.state.nodes[name].received_at = d.NOW - 1
    app.redraw()
    await pilot.pause()
    return app.screen.query_one(FleetTable)


def order(table: FleetTable) -> list[str]:
    return [str(row.key.value) for row in table.ordered_rows]


def bar(app: FleetdeckApp) -> str:
    content = app.screen.query_one("#fleet-bar", LiveStatic).content
    assert isinstance(content, Text)
    return content.plain


def drawn_node(table: FleetTable, y: int) -> str:
    """The node named on the table's painted line `y` (0 is the header)."""
    words = table.render_line(y).text.split()
    return words[0] if words else ""


def app_at_now(**console: Any) -> FleetdeckApp:
    app = FleetdeckApp(big_fleet(**console), connect=False, clock=lambda: d.NOW)
    app.animation_level = "none"
    return app


def by_rate(app: FleetdeckApp, reverse: bool = False) -> list[str]:
    nodes = app.state.nodes
    rates = {n: ns.snapshot.progress.rate_per_sec for n, ns in nodes.items()
             if ns.snapshot is not None and ns.snapshot.progress is not None}
    return sorted(rates, key=lambda n: rates[n], reverse=reverse)


async def test_sorted_by_rate_as_numbers_the_order_follows_and_the_cursor_keeps_its_node() -> None:
    app = app_at_now()
    async with app.run_test(size=SIZE) as pilot:
        table = await fed(pilot)
        assert order(table) == [f"gen-{i:02d}" for i in range(1, NODES + 1)]
        for _ in range(6):  # node, role, run, status, progress, rate
            await pilot.press("o")
        await until(pilot, lambda: order(table) == by_rate(app), 30, "rows by rate")
        assert "sorted by Rate ↑" in bar(app)
        rows = order(table)  # as numbers: 9.5/s before 10.0/s before 33.0/s before 100.0/s
        assert rows.index("gen-06") < rows.index("gen-01") < rows.index("gen-04") \
            < rows.index("gen-02")

        await pilot.press("O")
        await until(pilot, lambda: order(table) == by_rate(app, reverse=True), 30,
                    "rows by rate, fastest first")
        assert "sorted by Rate ↓" in bar(app)

        for _ in range(3):
            await pilot.press("down")
        chosen = table.selected_node
        assert chosen is not None
        was = table.cursor_row
        # the chosen node becomes the slowest, the slowest the fastest: both rows move
        slowest = order(table)[-1]
        app.ingest(chosen, snapshot(int(chosen[-2:]), rate=0.01))
        app.ingest(slowest, snapshot(int(slowest[-2:]), rate=500.0))
        app.redraw()
        await until(pilot, lambda: order(table) == by_rate(app, reverse=True), 30,
                    "the order after the rates changed")
        assert order(table)[0] == slowest and order(table)[-1] == chosen
        assert table.selected_node == chosen, "the cursor left its node"
        assert table.cursor_row == NODES - 1 != was
        await pilot.pause()
        drawn = [n for y in range(1, table.size.height) if (n := drawn_node(table, y))]
        assert len(drawn) > 5
        top = int(table.scroll_y)
        assert drawn == order(table)[top:top + len(drawn)], "rows drawn where they were"
        # what is drawn for the row the cursor is on is the chosen node's
        await pilot.press("enter")
        await until(pilot, lambda: app.current_node() == chosen, 30, "the chosen node open")


async def test_a_click_on_a_header_sorts_by_it_and_again_reverses() -> None:
    app = app_at_now()
    async with app.run_test(size=SIZE) as pilot:
        failed = {f"gen-{i:02d}": [0, 7, 12, 150, 3, 99][i % 6] for i in range(1, NODES + 1)}
        table = await fed(pilot, **{n: snapshot(int(n[-2:]), failed=k) for n, k in failed.items()})
        x = sum(table.columns[key].get_render_width(table)
                for key in list(table.columns)[:7])  # the Failed column's left edge
        await pilot.click(FleetTable, offset=(x + 2, 0))
        stable = sorted(failed, key=lambda n: failed[n])  # ties: in the fleet file's order
        await until(pilot, lambda: order(table) == stable, 30, "rows by failures")
        await pilot.click(FleetTable, offset=(x + 2, 0))
        await until(pilot, lambda: order(table) == sorted(failed, key=lambda n: failed[n],
                                                         reverse=True), 30, "reversed")
        assert "sorted by Failed ↓" in bar(app)


async def test_the_filter_narrows_by_name_state_and_alert_and_escape_shows_all() -> None:
    app = app_at_now()
    async with app.run_test(size=SIZE) as pilot:
        table = await fed(pilot, **{"gen-05": snapshot(5, status="paused")})
        await pilot.press("slash")
        await pilot.press(*"gen-1")
        want = [f"gen-{i}" for i in range(10, 20)]  # not gen-01
        await until(pilot, lambda: order(table) == want, 30, "the gen-1 nodes")
        assert f"10 of {NODES} shown, filter: gen-1" in bar(app)
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == NODES, 30, "every node again")
        assert order(table) == [f"gen-{i:02d}" for i in range(1, NODES + 1)]
        assert "shown" not in bar(app)

        await pilot.press("slash", *"PAUSED", "enter")  # a state, in any case
        await until(pilot, lambda: order(table) == ["gen-05"], 30, "the paused node")
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == NODES, 30, "every node again")

        await pilot.press("slash", *"oom")  # an alert's code
        await until(pilot, lambda: order(table) == ["gen-07", "gen-14", "gen-21"], 30,
                    "the nodes with an oom alert")
        await pilot.press(*"-nothing")
        await until(pilot, lambda: table.row_count == 0, 30, "an empty table")
        assert f"0 of {NODES} shown, filter: oom-nothing" in bar(app)
        assert table.selected_node is None
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == NODES, 30, "every node again")
        assert isinstance(app.screen, FleetScreen)


async def test_a_filter_holds_across_refreshes_with_the_sort() -> None:
    app = app_at_now()
    async with app.run_test(size=SIZE) as pilot:
        table = await fed(pilot)
        await pilot.press("slash", *"gen-1", "enter", "O")  # reverse: sorted by node, z-a
        want = [f"gen-{i}" for i in range(19, 9, -1)]
        await until(pilot, lambda: order(table) == want, 30, "the gen-1 nodes, z-a")
        await fed(pilot)  # a refresh: every snapshot again
        assert order(table) == want
        assert f"10 of {NODES} shown, filter: gen-1 · sorted by Node ↓" in bar(app)


async def test_sort_and_filter_are_allowed_read_only_and_their_keys_remap() -> None:
    app = FleetdeckApp(big_fleet(keymap={"fleet_sort": "z", "fleet_filter": "ctrl+f"}),
                       read_only=True, connect=False, clock=lambda: d.NOW)
    app.animation_level = "none"
    async with app.run_test(size=SIZE) as pilot:
        table = await fed(pilot)
        await pilot.press("o")  # no longer the sort key
        await pilot.press("z", "z", "z", "z", "z", "z")
        await until(pilot, lambda: order(table) == by_rate(app), 30, "rows by rate")
        await pilot.press("ctrl+f", *"gen-2")
        await until(pilot, lambda: sorted(order(table)) ==
                    [f"gen-{i}" for i in range(20, NODES + 1)], 30, "the gen-2 nodes")


async def test_the_palette_offers_the_filter_with_its_key_and_runs_it() -> None:
    from textual.command import CommandList, CommandPalette
    from textual.widgets import Input

    app = app_at_now(keymap={"fleet_filter": "z"})
    async with app.run_test(size=(160, 30)) as pilot:
        table = await fed(pilot)
        await pilot.press("ctrl+p")
        palette = await until(pilot, lambda: on_screen(app, CommandPalette), 60, "the palette")
        await pilot.press(*"filter")
        results = palette.query_one(CommandList)
        await until(pilot, lambda: any("[z]" in str(results.get_option_at_index(i).prompt)
                                       for i in range(results.option_count)), 60,
                    "the filter hit naming z")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.focused, Input)
                    and app.focused.id == "fleet-filter", 60, "the filter box")
        await pilot.press(*"gen-2")
        await until(pilot, lambda: table.row_count == 5, 30, "the gen-2 nodes")


async def test_a_campaigns_nodes_sort_under_its_row_and_it_stays_while_one_matches() -> None:
    from console.fleet import Campaign

    fleet = big_fleet()
    members = [f"gen-{i:02d}" for i in range(1, 9)]
    fleet.campaigns = [Campaign("traces", members)]
    app = FleetdeckApp(fleet, connect=False, clock=lambda: d.NOW)
    app.animation_level = "none"
    async with app.run_test(size=SIZE) as pilot:
        table = await fed(pilot)
        assert order(table)[0] == "traces"
        for _ in range(6):
            await pilot.press("o")
        free = [n for n in by_rate(app) if n not in members]
        want = ["traces", *[n for n in by_rate(app) if n in members], *free]
        await until(pilot, lambda: order(table) == want, 30, "the campaign's nodes by rate")

        await pilot.press("slash", *"gen-0")  # gen-01..09: eight of the campaign's, and one
        await until(pilot, lambda: order(table) == [*want[:9], "gen-09"], 30,
                    "the campaign, its nodes and gen-09")
        assert f"9 of {NODES} shown, filter: gen-0" in bar(app)
        await pilot.press("escape", "slash", *"TRACES")  # the campaign's name: all of its nodes
        await until(pilot, lambda: order(table) == want[:9], 30, "the campaign and its nodes")
