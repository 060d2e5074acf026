"""The fleet view's table: a row per node (role, run, status, progress, rate, ETA with its
p10-p90 band, failures, alerts, contact), and a row per campaign above its nodes with the same
figures rolled up (console/campaign.py). A node's row is built only when in view and its
figures changed, and only cells that changed are drawn again (LiveTable)."""

from __future__ import annotations

from functools import partial

from rich.text import Text
from textual.theme import Theme

from agents.rundir.schema import Snapshot
from console.queue.rollup import GIVEN_BACK, Rollup, from_state
from console.sanitize import shown
from console.state import FleetState, NodeState
from console.tui.widgets import figures as f
from console.tui.widgets.fleet_order import Order, campaign_value, matches, node_value, ordered
from console.tui.widgets.live_table import LiveTable, Row, RowSource
from console.tui.widgets.tones import LINK_TONE, RUN_TONE, style, toned

FLEET_COLUMNS = (("node", "Node", None), ("role", "Role", 8), ("run", "Run", 20),
                 ("status", "Status", 14), ("progress", "Progress", 21), ("rate", "Rate", 12),
                 ("eta", "ETA (p10–p90)", 14), ("failed", "Failed", 15), ("alerts", "Alerts", 6),
                 ("contact", "Contact", 24))
STALE_S = 5.0  # older than this, a node's figures are drawn dim: they are not live


def contact(ns: NodeState, now: float, theme: Theme, given_back: bool = False) -> Text:
    """The link's state and the age of the last snapshot: `1 s`, `reconnecting 12 s`; a node
    its campaign's queue records as given back, and that no longer answers: `given back`."""
    age = ns.age_s(now)
    if given_back:
        return toned(GIVEN_BACK, theme, "muted")
    if ns.link == "connected":
        text = f.age(age) if age is not None else "connected"
        return toned(text, theme, "warn" if age is not None and age > STALE_S else None)
    text = ns.link if age is None else f"{ns.link} {f.age(age)}"
    return toned(text, theme, LINK_TONE.get(ns.link, "bad"))


def fleet_row(ns: NodeState, now: float, theme: Theme, place: str | None = None,
              given_back: bool = False) -> Row:
    """A node's row; `place`: the node is one of a campaign's, drawn under its row (a
    training campaign's rank; "" for a generation node); `given_back`: its campaign's queue
    says so."""
    snap = ns.snapshot
    age = ns.age_s(now)
    stale = ns.link != "connected" or age is None or age > STALE_S
    dim = style(theme, "muted") if stale else ""
    name = Text(ns.name, style="bold")
    if place is not None:
        name = Text.assemble(("  └ ", "dim"), (ns.name, "bold"),
                             (f" {place}" if place else "", "dim"))
    role = ns.node.role
    if snap is None:
        blank = Text(f.DASH, style="dim")
        return (name, role, blank, blank, blank, blank, blank, blank, blank,
                contact(ns, now, theme, given_back))
    status = snap.status + (" (disk)" if snap.source == "disk" else "")
    status_cell = Text(status, style=dim or style(theme, RUN_TONE.get(snap.status)))
    progress = rate = eta = failed = f.DASH
    p = snap.progress
    if p is not None:
        progress = f"{f.pct(p.completed, p.total)} {f.si(p.completed)}/{f.si(p.total)}"
        rate = f.rate(p.rate_per_sec, "/s", 2 if p.rate_per_sec < 10 else 1)
        eta = f.eta_compact(p.eta_hours, p.eta_p10_hours, p.eta_p90_hours)
        failed = f"{f.num(p.failed)} ({f.pct(p.failed, p.completed + p.failed, 2)})" \
            if p.failed else "0"
    elif snap.train is not None:
        t = snap.train
        progress = f"{f.pct(t.step, t.total_steps)} {f.num(t.step)}/{f.num(t.total_steps)}"
        rate = f.rate(t.tokens_per_s, " tok/s")
        eta = f.hours(t.eta_hours)
    crit = any(a.severity == "critical" for a in snap.alerts)
    alerts = Text(str(len(snap.alerts)), style=style(theme, "bad" if crit else "warn")) \
        if snap.alerts else Text("0", style="dim")
    return (name, role, Text(shown(snap.run), style=dim), status_cell, Text(progress, style=dim),
            Text(rate, style=dim), Text(eta, style=dim), Text(failed, style=dim), alerts,
            contact(ns, now, theme, given_back))


def campaign_row(r: Rollup, theme: Theme) -> Row:
    """A campaign's row: its shards' figures added up, the slowest shard's ETA and band, and
    how many of its nodes are live."""
    name = Text.assemble(("▸ ", "bold"), (r.campaign, "bold"))
    if r.warnings:  # a ceded range nobody adopted, a node on another shard: open it
        many = len(r.warnings) > 1
        run = Text(f"{r.nodes} nodes · {len(r.warnings)} warning{'s' if many else ''}",
                   style=style(theme, "warn"))
    else:
        run = Text(f"campaign · {r.nodes} node{'s' if r.nodes != 1 else ''}")
    status = Text(r.status, style=style(theme, RUN_TONE.get(r.status)))
    if r.role == "train":
        progress = (f"{f.pct(r.step, r.total_steps)} {f.num(r.step)}/{f.num(r.total_steps)}"
                    if r.step is not None else f.DASH)
        rate = f.rate(r.rate_per_sec, " tok/s")
        eta = f.hours(r.eta_hours)
        failed = f.DASH
    else:
        progress = f"{f.pct(r.completed, r.total)} {f.si(r.completed)}/{f.si(r.total)}" \
            if r.answered else f.DASH
        rate = f.rate(r.rate_per_sec, "/s", 2 if r.rate_per_sec < 10 else 1)
        eta = f.eta_compact(r.eta_hours, r.eta_p10_hours, r.eta_p90_hours)
        failed = f"{f.num(r.failed)} ({f.pct(r.failed, r.completed + r.failed, 2)})" \
            if r.failed else "0"
    alerts = Text(str(len(r.alerts)), style=style(theme, "bad" if r.critical else "warn")) \
        if r.alerts else Text("0", style="dim")
    live = sum(1 for s in r.rows if s.link == "connected")
    gone = sum(1 for s in r.rows if s.link == GIVEN_BACK)
    text = f"{live}/{r.nodes} live" + (f", {gone} given back" if gone else "")
    contact = toned(text, theme, "warn" if live + gone < r.nodes else None)
    dim = style(theme, "muted") if not live else ""  # no node live: figures are old
    return (name, r.role, run, status, Text(progress, style=dim), Text(rate, style=dim),
            Text(eta, style=dim), Text(failed, style=dim), alerts, contact)


class FleetTable(LiveTable):
    COLUMNS = FLEET_COLUMNS

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._campaigns: set[str] = set()
        # Per node: what its row was drawn from, and the row. A node's figures change once a
        # second at most, and its row is built again only then.
        self._built: dict[str, tuple[Snapshot | None, tuple[object, ...], Row]] = {}
        self.order = Order()  # the sort and filter the screen's keys set
        self.shown = 0  # nodes the filter lets through, as last shown

    def node_row(self, ns: NodeState, now: float, theme: Theme, place: str | None = None,
                 given_back: bool = False) -> Row:
        """fleet_row, built again only when what it shows changed (its snapshot, link, age
        as shown, theme, place)."""
        age = ns.age_s(now)
        stale = age is None or age > STALE_S
        key = (ns.link, f.age(age), stale, theme.name, place, given_back, ns.node.role)
        built = self._built.get(ns.name)
        if built is not None and built[0] is ns.snapshot and built[1] == key:
            return built[2]
        row = fleet_row(ns, now, theme, place, given_back)
        self._built[ns.name] = (ns.snapshot, key, row)
        return row

    def forget(self) -> None:
        super().forget()
        self._built.clear()

    def show(self, state: FleetState, now: float, theme: Theme) -> None:
        """Each campaign's row, then its nodes; then the nodes of no campaign; sorted within
        those groups by `order`'s column, and only the nodes its filter matches (a campaign
        shows while one of its nodes does, or its name matches). Campaign and node names never
        clash (the fleet file refuses it), so each names its own row."""
        order = self.order
        rows: dict[str, RowSource] = {}  # a node's row is built only in view
        self._campaigns = {c.name for c in state.fleet.campaigns}
        shown = 0
        column, reverse, text = order.column, order.reverse, order.filter.casefold()

        def sort(names: list[str]) -> list[str]:
            if column is None:
                return names
            return ordered(names, lambda n: node_value(state.nodes[n], column, now), reverse)

        groups: list[tuple[Rollup, list[str]]] = []
        for c in state.fleet.campaigns:
            r = from_state(state, c)
            names = [line.node for line in r.rows if line.node in state.nodes]
            if text and text not in c.name.casefold():
                names = [n for n in names if matches(state.nodes[n], text)]
                if not names:
                    continue
            groups.append((r, names))
        if column is not None:
            groups = ordered(groups, lambda g: campaign_value(g[0], column), reverse)
        for r, names in groups:
            rows[r.campaign] = campaign_row(r, theme)
            lines = {line.node: line for line in r.rows}
            for name in sort(names):
                line = lines[name]
                place = line.place if line.place != line.node else ""
                rows[name] = partial(self.node_row, state.nodes[name], now, theme, place,
                                     line.link == GIVEN_BACK)
            shown += len(names)
        free = [n for n, ns in state.nodes.items()
                if n not in rows and matches(ns, text)]
        for name in sort(free):
            rows[name] = partial(self.node_row, state.nodes[name], now, theme)
        self.shown = shown + len(free)
        self.sync(rows, ordered=True)

    @property
    def selected_node(self) -> str | None:
        key = self.selected_key
        return None if key in self._campaigns else key

    @property
    def selected_campaign(self) -> str | None:
        key = self.selected_key
        return key if key in self._campaigns else None
