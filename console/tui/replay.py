"""The replay's TUI: the fleetdeck app drawn from a Recording (console/replay.py) instead of
links, its clock the cursor's time, with a bar that says where the cursor stands and keys to
step, play and jump. Nothing is sent anywhere: the node's actions are refused."""

from __future__ import annotations

import time
from typing import ClassVar

import msgspec
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from console.replay import Recording, parse_time, when
from console.sanitize import shown_markup
from console.tui.app import KEYMAP_OWNERS, FleetdeckApp
from console.tui.handlers import NAVIGATION
from console.tui.history import MAX_POINTS
from console.tui.screens.base import View
from console.tui.widgets.keys import key_for

PLAY_TICK_S = 0.25
SPEEDS = (1, 10, 60, 600, 3600)  # replayed seconds per second
BIG_STEP = 30  # samples


class ReplayBar(Static):
    """One line at the bottom of every view: the cursor's time, its place, play or pause."""


class TimeModal(ModalScreen[str | None]):
    """Asks for a time to jump to (the forms console/replay.py parse_time takes)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel",
                                                     id="replay_jump_cancel")]
    DEFAULT_CLASSES = "question"

    def __init__(self, start: float, end: float) -> None:
        super().__init__()
        self.start, self.end = start, end

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Jump to a time", classes="dialog-title")
            yield Static(f"the run: {when(self.start)} to {when(self.end)} UTC. Give start, "
                         "end, +1h30m (from the start), HH:MM[:SS] or YYYY-MM-DD HH:MM[:SS] "
                         "(UTC)", classes="dialog-detail")
            yield Input("", id="replay-time", placeholder="+30m")
            yield Static("", classes="dialog-error", id="replay-error")

    def on_mount(self) -> None:
        self.query_one("#replay-time", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            parse_time(event.value, self.start, self.end)
        except ValueError as exc:
            self.query_one("#replay-error", Static).update(shown_markup(exc))  # typed text
            return
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ReplayApp(FleetdeckApp):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "play", "Play/pause", id="replay_play"),
        Binding("full_stop", "step(1)", "Step", id="replay_step"),
        Binding("comma", "step(-1)", "Back", id="replay_back"),
        Binding("greater_than_sign", f"step({BIG_STEP})", f"+{BIG_STEP}",
                id="replay_step_big"),
        Binding("less_than_sign", f"step(-{BIG_STEP})", f"-{BIG_STEP}", id="replay_back_big"),
        Binding("g", "jump", "Jump to", id="replay_jump"),
        Binding("right_square_bracket", "speed(1)", "Faster", id="replay_faster"),
        Binding("left_square_bracket", "speed(-1)", "Slower", id="replay_slower"),
    ]

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        super().__init__(recording.fleet(), read_only=True, connect=False,
                         clock=lambda: self.recording.now)
        self.playing = False
        self.speed = SPEEDS[2]
        self._play_at = recording.now  # the replayed time, between samples while playing
        self._last_tick = 0.0

    def keymap_owners(self) -> tuple[type[DOMNode], ...]:
        return REPLAY_KEYMAP_OWNERS

    def on_mount(self) -> None:
        super().on_mount()
        self.state.set_link(self.recording.node, "connected", None)
        self.set_interval(PLAY_TICK_S, self._play_tick)
        self.show_cursor()
        self.call_after_refresh(self._open_recorded_node)

    async def _open_recorded_node(self) -> None:
        await self.show_node(self.recording.node)
        self.show_cursor()

    # -- the cursor ---------------------------------------------------------------------------

    def show_cursor(self) -> None:
        """The sample under the cursor into the state (as if pushed then) and the sparklines'
        past up to it; then a redraw."""
        rec = self.recording
        name = rec.node
        self.state.apply(name, msgspec.json.encode(rec.snapshot()))
        history = self.fetched[name].history
        history.points.clear()
        for p in rec.history_before(MAX_POINTS):
            history.add_progress(p)
        history.loaded = True
        history.version += 1
        self._changes += 1
        self.redraw()

    def bar_text(self) -> str:
        rec = self.recording
        screen = self.shown

        def k(binding_id: str) -> str:
            return key_for(screen, binding_id) if screen is not None else "?"

        state = f"playing {self.speed}x" if self.playing else "paused"
        at = rec.now - rec.start
        text = (f" REPLAY {rec.node} · {when(rec.now)} UTC · +{_span(at)} of "
                f"{_span(rec.end - rec.start)} · sample {rec.cursor + 1}/{len(rec.samples)} · "
                f"{state} · {k('replay_play')} play · {k('replay_back')} "
                f"{k('replay_step')} step · {k('replay_jump')} jump · "
                f"{k('replay_slower')} {k('replay_faster')} speed")
        return shown_markup(text)  # the node is a folder's name, and `[` is a key

    def redraw(self) -> None:
        super().redraw()
        screen = self.shown
        if not isinstance(screen, View) or not screen.is_mounted:
            return
        bars = screen.query(ReplayBar)
        if bars:
            bars.first().update(self.bar_text())
        else:
            screen.mount(ReplayBar(self.bar_text(), id="replay-bar"))

    # -- the keys -----------------------------------------------------------------------------

    def action_step(self, n: int) -> None:
        self.playing = False
        self.recording.step(n)
        self._play_at = self.recording.now
        self.show_cursor()

    def action_play(self) -> None:
        rec = self.recording
        if not self.playing and rec.cursor == len(rec.samples) - 1:
            rec.cursor = 0  # at the end, play starts again from the start
        self.playing = not self.playing
        self._play_at = rec.now
        self._last_tick = time.monotonic()
        self.show_cursor()

    def action_speed(self, change: int) -> None:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 2
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + change))]
        self.show_cursor()

    def action_jump(self) -> None:
        rec = self.recording
        self.playing = False

        def jump(answer: str | None) -> None:
            if answer is None:
                return
            rec.jump(parse_time(answer, rec.start, rec.end))  # the modal checked it
            self._play_at = rec.now
            self.show_cursor()

        self.push_screen(TimeModal(rec.start, rec.end), jump)

    def _play_tick(self) -> None:
        if not self.playing:
            return
        now = time.monotonic()
        self._play_at += (now - self._last_tick) * self.speed
        self._last_tick = now
        rec = self.recording
        before = rec.cursor
        rec.jump(self._play_at)
        if rec.cursor == len(rec.samples) - 1 and self._play_at >= rec.end:
            self.playing = False  # the end of the run
        if rec.cursor != before or not self.playing:
            self.show_cursor()

    async def action_do(self, action_id: str) -> None:
        """Only looking around: nothing is sent to a node in a replay."""
        if action_id in NAVIGATION:
            await super().action_do(action_id)
        else:
            self.notify(f"replay: {action_id} is not available: this is a recording, not a "
                        "live node", severity="warning", timeout=5)


# What a replay's keymap moves: the app's ids and the replay's own.
REPLAY_KEYMAP_OWNERS = (*KEYMAP_OWNERS, ReplayApp, TimeModal)


def _span(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_replay(recording: Recording) -> int:
    code = ReplayApp(recording).run()
    return code or 0
