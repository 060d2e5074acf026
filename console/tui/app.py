"""The fleetdeck TUI: one AgentLink per node in its own named worker, snapshots applied to
FleetState as they arrive, and the screen redrawn from that state a few times a second (one
slow or dead node never stalls the others or the screen). Keys come from the action registry
(binding ids = RPC method names), remappable from the fleet file's [console.keymap] like every
screen's and modal's (console/tui/keymap.py). Handlers and the palette see the app through
the narrow ports of console/tui/port.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, ClassVar

from textual import on
from textual.app import App, ScreenStackError
from textual.binding import Binding, BindingType
from textual.dom import DOMNode
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.worker import Worker, WorkerState

from agents.rpc.protocol import RpcError
from agents.rundir.schema import Alert
from console.actions import ACTIONS, BY_ID
from console.alerting import run_alert_command
from console.fleet import Fleet, Node
from console.linkstate import LinkState
from console.logfollow import BadLogAnswer
from console.sanitize import shown_markup
from console.state import FleetState
from console.transport import AgentLink, HostKeyProblem, accept_host_key
from console.tui import heap
from console.tui.campaign_actions import CampaignControls
from console.tui.fetched import Fetched
from console.tui.handlers import NAVIGATION, Controls
from console.tui.history import MAX_POINTS, SPAN_TITLES
from console.tui.keymap import binding_ids, resolve
from console.tui.log_follow import LogFollower
from console.tui.messages import (
    ActionReport,
    HistoryFetched,
    LinkChanged,
    LogFetched,
    SamplesFetched,
)
from console.tui.palette import ActionCommands
from console.tui.port import AnswerT
from console.tui.screens.base import View, ViewContext
from console.tui.screens.campaign import CampaignScreen
from console.tui.screens.decommission import DecommissionScreen
from console.tui.screens.failures import FailuresScreen
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.node import GenerateScreen, NodeView, TrainScreen
from console.tui.terminal import run_in_terminal
from console.tui.widgets.confirm import ChoiceModal, ConfirmModal
from console.tui.widgets.hostkey import HostKeyModal
from console.tui.widgets.log_pane import LogPane
from console.tui.widgets.prompt import ValueModal
from console.tui.widgets.retry import RetryModal
from themes import stylesheet
from themes.palette import DEFAULT_THEME, NAMES, THEMES

REDRAW_S = 0.5  # at most two redraws a second, however many nodes report
QUEUE_LOOK_S = 30.0  # how often a generation campaign's queue is asked for its given-back nodes
AGES_S = 1.0  # ages on screen tick at least once a second
HISTORY_WINDOW_S = 3600.0
CLOSE_TIMEOUT_S = 10.0

# The footer shows the everyday actions first; the palette lists them all.
FOOTER_ORDER = ("pause", "unpause", "resize", "resize_up", "resize_down", "autotune",
                "max_tokens", "retry",
                "logs", "samples", "next_node", "fleet", "resume", "stop", "restart_server",
                "down", "launch", "pull", "decommission", "theme")
FOOTER_LABELS = {"resize_up": "more", "resize_down": "fewer", "autotune": "auto",
                 "restart_server": "Restart"}
# Bound and in the palette, but not worth footer room (rare, or one kind of node only;
# failures, shell, dataset, report: the footer is full at 200 columns, and their keys are in
# the README's table).
FOOTER_HIDDEN = frozenset({"export", "theme", "failures", "shell", "dataset", "report"})


def action_bindings() -> list[BindingType]:
    order = {a: i for i, a in enumerate(FOOTER_ORDER)}
    ranked = sorted(ACTIONS, key=lambda a: order.get(a.id, len(order)))
    return [Binding(a.key, f"do('{a.id}')", FOOTER_LABELS.get(a.id, a.title), id=a.id,
                    tooltip=a.description, show=a.id not in FOOTER_HIDDEN) for a in ranked]


class FleetdeckApp(App[int]):
    TITLE = "fleetdeck"
    CSS_PATH = str(stylesheet())
    COMMANDS: ClassVar = App.COMMANDS | {ActionCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        *action_bindings(),
        Binding("escape", "do('fleet')", "Fleet", show=False, id="back"),
        Binding("q", "quit", "Quit", id="quit"),
    ]

    def __init__(self, fleet: Fleet, read_only: bool = False, connect: bool = True,
                 accept_new_host_key: bool = False,
                 clock: Callable[[], float] = time.time, note: str | None = None,
                 exit_after: float | None = None, quiet_gc: bool = False) -> None:
        super().__init__()
        self.quiet_gc = quiet_gc  # the process is the TUI's alone (run_app): console/tui/heap
        self.note = note  # shown once at start (the demo says what it runs)
        self.exit_after = exit_after
        self.fleet = fleet
        self.settings = fleet.console
        self.read_only = read_only or self.settings.read_only
        self.connect = connect
        self.accept_new_host_key = accept_new_host_key
        self.clock = clock  # tests freeze it: every age on screen is computed from it
        self.state = FleetState(fleet, on_new_alert=self._new_alert, clock=clock)
        self.fetched: dict[str, Fetched] = {n.name: Fetched() for n in fleet.nodes}
        self.links: dict[str, AgentLink] = {}
        self.controls = Controls(self)
        self.campaign_controls = CampaignControls(self, self.controls)
        self.log_follower = LogFollower(self)
        # Generation campaigns: their queues say which nodes were given back (any console's
        # decommission-check records it in the campaign's prefix).
        self.queued = [c for c in fleet.campaigns if fleet.campaign_role(c) == "generate"]
        self.render_errors: list[str] = []
        self._drawn: tuple[int, ...] = ()
        self._last_draw = 0.0
        self._changes = 0  # bumped by fetched data and link events
        self._asking_host_key: set[str] = set()
        self._keys = {a.id: a.key for a in ACTIONS}
        self._terminal_lent = False  # a shell on a node has the terminal

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Notifications carry node and agent text: never parse it as markup by default."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def bell(self) -> None:
        if not self._terminal_lent:  # the writer is stopped while another program has it
            super().bell()

    async def lend_terminal(self, argv: list[str], cwd: str | None = None,
                            held: Callable[[int], str | None] = lambda _code: None) -> int:
        """The terminal to argv until it exits (console/tui/terminal.py); its exit status."""
        if self._terminal_lent:
            raise RuntimeError("the terminal is already lent")
        self._terminal_lent = True
        try:
            return await run_in_terminal(self, argv, cwd, held)
        finally:
            self._terminal_lent = False
            self.call_after_refresh(self.redraw)

    # -- start ------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[Any]:
        return FleetScreen()

    def on_mount(self) -> None:
        for theme in THEMES:
            self.register_theme(theme)
        wanted = self.settings.theme
        if wanted in self.available_themes:
            self.theme = wanted
        else:
            self.theme = DEFAULT_THEME
            self.notify(f"{self.fleet.source}: [console] theme {wanted!r} is not a theme "
                        f"(try {', '.join(NAMES)}); using {DEFAULT_THEME}", severity="warning")
        self._apply_keymap()
        self.theme_changed_signal.subscribe(self, lambda _theme: self._forget_and_redraw())
        if self.connect:
            for node in self.fleet.nodes:
                self.start_link(node)
        self.set_interval(REDRAW_S, self._tick)
        if self.connect and self.queued:
            self.set_interval(QUEUE_LOOK_S, self._look_at_queues)
        self.call_after_refresh(self.redraw)
        if self.quiet_gc:
            self.call_after_refresh(heap.quiet_gc)
        if self.note:
            self.notify(self.note, timeout=20)
        if self.exit_after is not None:
            self.set_timer(self.exit_after, lambda: self.exit(0))

    def _apply_keymap(self) -> None:
        keymap = resolve(self.settings.keymap, binding_ids(self.keymap_owners()),
                         self.fleet.source)
        for warning in keymap.warnings:
            self.notify(warning, severity="warning", timeout=15)
        self._keys.update(keymap.keys)
        self.set_keymap(keymap.keys)

    def keymap_owners(self) -> tuple[type[DOMNode], ...]:
        """The classes whose binding ids the user's keymap may move (a replay adds its own)."""
        return KEYMAP_OWNERS

    def key_for(self, action_id: str) -> str:
        return self._keys.get(action_id, "")

    # -- links ------------------------------------------------------------------------------

    def start_link(self, node: Node) -> None:
        link = AgentLink(node, on_snapshot=self.ingest, on_state=self._on_link_state)
        self.links[node.name] = link
        self.state.set_link(node.name, "connecting", None)
        self.run_worker(self._run_link(link), name=f"link-{node.name}",
                        group=f"link-{node.name}", exclusive=True, exit_on_error=False)

    async def _run_link(self, link: AgentLink) -> None:
        try:
            await link.run()
        finally:
            await link.close()

    async def on_unmount(self) -> None:
        # Close every channel (and reap local agents) before the loop goes: workers are only
        # cancelled at exit, not waited for.
        try:
            await asyncio.wait_for(asyncio.gather(
                *(link.close() for link in self.links.values()), return_exceptions=True),
                CLOSE_TIMEOUT_S)
        except TimeoutError:
            pass  # a hung channel must not hold the terminal; the process exit ends it

    def stop_link(self, name: str) -> None:
        self.workers.cancel_group(self, f"link-{name}")

    def ingest(self, name: str, raw: dict[str, Any] | bytes) -> None:
        """A snapshot from a node (pushed, or fed by tests): into the state and the history.
        Drawing follows on the next tick, however many snapshots arrive meanwhile."""
        snap = self.state.apply(name, raw)
        if snap is not None and snap.progress is not None:
            self.fetched[name].history.add_progress(snap.progress)

    def _on_link_state(self, name: str, state: LinkState, error: str | None) -> None:
        self.post_message(LinkChanged(name, state, error))

    @on(LinkChanged)
    def _link_changed(self, event: LinkChanged) -> None:
        link = self.links.get(event.node)
        stopped = self.state.nodes[event.node].link == "host key" and event.state != "connected"
        if link is None or stopped:
            return  # a stopped link's last words
        self.state.set_link(event.node, event.state, event.error)
        self._changes += 1
        if event.state == "host key":
            self._host_key(event.node, link)
        elif event.state == "version mismatch":
            self.notify(shown_markup(event.error or f"{event.node}: agent version mismatch"),
                        severity="error", timeout=20)

    def _host_key(self, name: str, link: AgentLink) -> None:
        self.stop_link(name)  # nothing more is tried until someone decides
        problem = link.host_key_problem
        if problem is None or problem.kind == "changed":
            self.notify(str(problem or f"{name}: host key problem"), title="Host key",
                        severity="error", timeout=30)
            return
        node = self.fleet.node(name)
        if self.accept_new_host_key:
            self._accept_host_key(node, problem)
            return
        if name in self._asking_host_key:
            return
        self._asking_host_key.add(name)

        def decided(yes: bool | None) -> None:
            self._asking_host_key.discard(name)
            if yes:
                self._accept_host_key(node, problem)
            else:
                self.notify(f"{name}: host key not trusted; the node stays unconnected",
                            severity="warning")

        self.push_screen(HostKeyModal(name, node.host or "", problem.fingerprint,
                                      problem.known_hosts), decided)

    def _accept_host_key(self, node: Node, problem: HostKeyProblem) -> None:
        async def accept() -> None:
            try:
                # Exactly the key whose fingerprint the user saw: never fetched again.
                fingerprint = await accept_host_key(node, problem)
            except (OSError, TimeoutError, HostKeyProblem) as exc:
                self.report(node.name, f"could not accept the host key: {exc}", ok=False)
                return
            self.report(node.name, f"host key {fingerprint} accepted; connecting")
            self.start_link(node)

        self.run_worker(accept(), name=f"hostkey-{node.name}", group=f"hostkey-{node.name}",
                        exclusive=True, exit_on_error=False)

    def connected_link(self, name: str) -> AgentLink | None:
        link = self.links.get(name)
        return link if link is not None and self.state.nodes[name].link == "connected" else None

    async def call_node(self, name: str, method: str, params: dict[str, Any],
                        timeout: float = 60.0) -> Any:
        link = self.connected_link(name)
        if link is None:
            raise ConnectionError(f"{name} is not connected ({self.state.nodes[name].link})")
        return await link.call(method, params, timeout=timeout)

    # -- alerts -----------------------------------------------------------------------------

    def _new_alert(self, name: str, alert: Alert) -> None:
        if self.settings.bell:
            self.bell()
        where = f" (server {alert.server})" if alert.server is not None else ""
        self.notify(shown_markup(f"{name}{where}: {alert.message}"),
                    title=shown_markup(f"Alert: {alert.code}"),
                    severity="error" if alert.severity == "critical" else "warning",
                    timeout=15)
        command = self.settings.alert_command
        if command:
            self.run_worker(run_alert_command(command, name, alert), name="alert-command",
                            group="alert-command", exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.notify(shown_markup(f"{event.worker.name}: {event.worker.error}"),
                        severity="error",
                        timeout=15)

    def _look_at_queues(self) -> None:
        for c in self.queued:
            self.run_worker(self._look_at_queue(c), name=f"queue {c.name}", group="queue",
                            exclusive=False, exit_on_error=False)

    async def _look_at_queue(self, campaign: Any) -> None:
        """One connected node's `queue_status`: the campaign's given-back nodes, from S3."""
        for name in campaign.nodes:
            if self.connected_link(name) is None:
                continue
            try:
                answer = await self.call_node(name, "queue_status", {}, timeout=60.0)
            except Exception:  # that node cannot say: the next one may
                continue
            nodes = answer.get("nodes", {}) if isinstance(answer, dict) else {}
            gone = {n for n, v in nodes.items() if isinstance(v, dict) and "given_back" in v}
            if gone != self.state.given_back.get(campaign.name, set()):
                self.state.given_back[campaign.name] = gone
                self.state.version += 1
            return

    # -- drawing ----------------------------------------------------------------------------

    def context(self) -> ViewContext:
        return ViewContext(self.state, self.fetched, self.clock(), self.current_theme,
                           self.read_only)

    @property
    def shown(self) -> Screen[Any] | None:
        """The screen on top, or None while the app starts or closes: a timer or a worker can
        run then, and `self.screen` raises with no screen on the stack (CI saw it)."""
        try:
            return self.screen
        except ScreenStackError:
            return None

    def _tick(self) -> None:
        key = (self.state.version, self._changes, id(self.shown))
        if key != self._drawn or time.monotonic() - self._last_draw >= AGES_S:
            self.redraw()
        due = self.log_follower.due()
        if due is not None:
            self.run_worker(self.log_follower.poll(*due), name=f"log-{due[0]}",
                            group=f"log-{due[0]}", exit_on_error=False)

    def redraw(self) -> None:
        screen = self.shown
        self._drawn = (self.state.version, self._changes, id(screen))
        self._last_draw = time.monotonic()
        if not isinstance(screen, View) or not screen.is_mounted:
            return
        try:
            screen.show(self.context())
        except Exception as exc:  # a drawing bug must never take the terminal down
            text = f"{type(exc).__name__}: {exc}"
            if text not in self.render_errors:
                self.render_errors.append(text)
                self.notify(f"cannot draw {screen.name or 'the screen'}: {text}",
                            severity="error")

    def _forget_and_redraw(self) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, View) and screen.is_mounted:
                screen.forget()
        self.redraw()

    # -- navigation -------------------------------------------------------------------------

    def current_node(self) -> str | None:
        screen = self.shown
        if isinstance(screen, NodeView):
            return screen.node_name
        if isinstance(screen, FleetScreen):
            return screen.selected_node
        return None

    def current_campaign(self) -> str | None:
        screen = self.shown
        if isinstance(screen, CampaignScreen):
            return screen.campaign_name
        if isinstance(screen, FleetScreen):
            return screen.selected_campaign
        return None

    async def show_node(self, name: str) -> NodeView:
        """The node's screen, opened if another is shown."""
        screen = self.shown
        if isinstance(screen, NodeView) and screen.node_name == name:
            return screen
        snap = self.state.nodes[name].snapshot
        role = snap.kind if snap is not None else self.fleet.node(name).role
        new: NodeView = TrainScreen(name) if role == "train" else GenerateScreen(name)
        if isinstance(screen, NodeView):
            await self.switch_screen(new)
        else:
            await self.push_screen(new)
        self.redraw()
        if role == "generate" and not self.fetched[name].history.loaded and self.connect:
            self.run_worker(self._fetch_history(name), name=f"history-{name}",
                            group=f"history-{name}", exclusive=True, exit_on_error=False)
        return new

    async def ask(self, modal: ModalScreen[AnswerT]) -> AnswerT:
        answer: AnswerT = await self.push_screen_wait(modal)
        return answer

    async def open_screen(self, screen: Screen[Any]) -> None:
        await self.push_screen(screen)

    def show_fleet(self) -> None:
        while len(self.screen_stack) > 1 and isinstance(self.screen, View):
            self.pop_screen()
        self.call_after_refresh(self.redraw)

    @on(FleetScreen.OpenNode)
    @on(CampaignScreen.OpenNode)
    async def _open_node(self, event: FleetScreen.OpenNode | CampaignScreen.OpenNode) -> None:
        await self.show_node(event.name)

    @on(FleetScreen.OpenCampaign)
    async def _open_campaign(self, event: FleetScreen.OpenCampaign) -> None:
        await self.push_screen(CampaignScreen(event.name))
        self.redraw()

    async def _fetch_history(self, name: str) -> None:
        """The node's history over the span its sparklines show, served downsampled by the
        node (agents/rundir/histstore.py) in one reply of at most MAX_POINTS items."""
        hist = self.fetched[name].history
        span = hist.span
        params: dict[str, Any] = {"span": span, "limit": MAX_POINTS}
        if span == "1h":
            snap = self.state.nodes[name].snapshot
            params["since"] = (snap.updated_at if snap is not None else self.clock()) \
                - HISTORY_WINDOW_S
        try:
            reply = await self.call_node(name, "history", params)
        except (RpcError, ConnectionError, TimeoutError, OSError) as exc:
            self.report(name, f"history unavailable: {exc}", ok=False)
            return
        items = reply.get("items") if isinstance(reply, dict) else None
        step = reply.get("step_s") if isinstance(reply, dict) else None
        self.post_message(HistoryFetched(
            name, [i for i in items if isinstance(i, dict)] if isinstance(items, list) else [],
            span, float(step) if isinstance(step, (int, float)) and step > 0 else None))

    @on(GenerateScreen.CycleHistorySpan)
    def _cycle_history_span(self, event: GenerateScreen.CycleHistorySpan) -> None:
        span = self.fetched[event.name].history.cycle_span()
        self._changes += 1
        self.redraw()
        if self.connect:
            self.run_worker(self._fetch_history(event.name), name=f"history-{event.name}",
                            group=f"history-{event.name}", exclusive=True,
                            exit_on_error=False)
        self.notify(f"{event.name}: sparklines over the {SPAN_TITLES[span]}", timeout=2)

    # -- worker results ---------------------------------------------------------------------

    @on(HistoryFetched)
    def _history_fetched(self, event: HistoryFetched) -> None:
        hist = self.fetched[event.node].history
        if event.span != hist.span:
            return  # fetched for a span cycled past since
        hist.load(event.items, event.step_s)
        self._changes += 1

    @on(LogFetched)
    def _log_fetched(self, event: LogFetched) -> None:
        fetched = self.fetched[event.node]
        version = fetched.version
        error = event.error
        if error is None and event.reply is None:
            fetched.select_log(event.name)
        elif error is None:
            try:
                fetched.set_log(event.name, event.reply, event.select)
            except BadLogAnswer as exc:
                error = str(exc)
        if error is not None:
            view = fetched.logs.get(event.name)
            if view is not None and view.follow:
                view.follow = False
                fetched.version += 1
            self.report(event.node, f"log {event.name}: {error}; not following it", ok=False)
        if fetched.version != version:
            self._changes += 1
            self.redraw()

    @on(SamplesFetched)
    def _samples_fetched(self, event: SamplesFetched) -> None:
        self.fetched[event.node].set_samples(event.reply)
        self._changes += 1
        self.redraw()

    def report(self, node: str, text: str, ok: bool = True) -> None:
        self.post_message(ActionReport(node, text, ok))

    @on(ActionReport)
    def _action_report(self, event: ActionReport) -> None:
        # Reports carry what nodes said: shown escaped, never parsed as markup.
        self.notify(shown_markup(f"{event.node}: {event.text}"),
                    severity="information" if event.ok
                    else "error", timeout=6 if event.ok else 12)

    # -- actions ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "do" and parameters:
            a = BY_ID.get(str(parameters[0]))
            if a is None or (self.read_only and a.read_write):
                return False  # --read-only: gone from the keys, the footer and the palette
        return True

    async def action_do(self, action_id: str) -> None:
        a = BY_ID.get(action_id)
        if a is None or (self.read_only and a.read_write):
            return
        campaign = self.current_campaign()
        if action_id in NAVIGATION:
            await self.navigate(action_id)
        elif campaign is not None:
            self.run_worker(self.campaign_controls.run(action_id, campaign),
                            name=f"action-{action_id}", group="actions", exit_on_error=False)
        else:
            self.run_worker(self.controls.run(action_id), name=f"action-{action_id}",
                            group="actions", exit_on_error=False)

    async def navigate(self, action_id: str) -> None:
        """The registry actions that change what is shown (handlers.NAVIGATION)."""
        if action_id == "fleet":
            self.show_fleet()
        elif action_id == "next_node":
            await self._next_node()
        elif action_id == "theme":
            names = list(NAMES)
            i = names.index(self.theme) + 1 if self.theme in names else 0
            self.theme = names[i % len(names)]
            self.notify(f"theme {self.theme}", timeout=2)
        else:
            raise ValueError(f"{action_id!r} is not a navigation action ({sorted(NAVIGATION)})")

    async def perform(self, action_id: str) -> None:
        """A registry action from the palette: the same path as its key."""
        await self.run_action(f"do('{action_id}')")

    def use_theme(self, name: str) -> None:
        self.theme = name

    async def _next_node(self) -> None:
        names = self.state.names()
        if not names:
            return
        current = self.current_node()
        if isinstance(self.shown, NodeView) and current in names:
            name = names[(names.index(current) + 1) % len(names)]
        else:
            name = current or names[0]
        await self.show_node(name)


# Every class whose bindings the keymap may move: the app, its screens and its modals.
KEYMAP_OWNERS = (FleetdeckApp, FleetScreen, GenerateScreen, TrainScreen, DecommissionScreen,
                 FailuresScreen, ConfirmModal, HostKeyModal, ChoiceModal, RetryModal, ValueModal,
                 LogPane)
