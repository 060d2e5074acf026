"""The log pane (the `logs` RPC, followed): one log of the run at a time, the engine's, the
supervisor's or one server's, with the keys of a log viewer while it has focus: follow,
search (`/`, n and N, matches highlighted), a level filter. Each log's place (its view, its
search, its filter) is kept in its LogView, so switching logs and back finds it as left."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from typing import Any, ClassVar

from rich.highlighter import Highlighter
from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Input, Label, Log

from console.logfollow import FILTERS, MARK, MAX_LINES
from console.sanitize import shown, shown_markup
from console.tui.fetched import LogView

MATCH = Style(reverse=True, bold=True)


def matcher(term: str) -> re.Pattern[str] | None:
    """The search as a pattern: the text as written (never a regex), ignoring case unless it
    holds a capital (as less and vim's smartcase do)."""
    if not term:
        return None
    return re.compile(re.escape(term), 0 if any(c.isupper() for c in term) else re.IGNORECASE)


class SearchHighlighter(Highlighter):
    def __init__(self) -> None:
        self.pattern: re.Pattern[str] | None = None

    def highlight(self, text: Text) -> None:
        if self.pattern is not None:
            text.highlight_regex(self.pattern, MATCH)


class LogLines(Log):
    """The lines shown: Textual's Log, its highlighter the search's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(highlight=True, max_lines=MAX_LINES, auto_scroll=True, **kwargs)
        self.search = SearchHighlighter()
        self.highlighter = self.search


class LogPane(Vertical):
    # The node view's own keys mean other things (f: the fleet, n: the next node); these are
    # the pane's while it has focus, as a pager's keys are while it runs.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "follow", "Follow", id="log_follow",
                tooltip="follow the log: new lines every second, the view at the end"),
        Binding("slash", "search", "Search", id="log_search",
                tooltip="search the log; enter jumps to the newest match"),
        Binding("n", "next_match", "Next match", id="log_next_match",
                tooltip="the next match down (newer)"),
        Binding("N", "previous_match", "Previous match", id="log_previous_match",
                tooltip="the next match up (older)"),
        Binding("w", "level", "Level", id="log_level",
                tooltip="show all lines, warnings and worse, or errors only"),
        Binding("escape", "clear", "Clear the search", show=False, id="log_clear",
                tooltip="close the search (again: back to the fleet)"),
    ]

    def __init__(self, key: str, **kwargs: Any) -> None:
        """`key`: the key of the `logs` action, for the hint."""
        super().__init__(**kwargs)
        self.key = key
        self.view: LogView | None = None
        self._seqs: list[int] = []  # the seq of each line shown, in order
        self._end = 0  # the seq after the last line drawn
        self._drawn: tuple[int, int] = (-1, -1)  # (rewrites, level) drawn

    def compose(self) -> ComposeResult:
        yield Label(f"press {self.key} for the log tail (the selected GPU's server log when the "
                    "GPU table has focus)", id="log-title", classes="pane-title")
        yield LogLines(id="log")
        yield Input(placeholder="search the log (enter: the newest match; escape: clear)",
                    id="log-search")

    @property
    def lines(self) -> list[str]:
        return list(self.query_one(LogLines).lines)

    @property
    def log_lines(self) -> LogLines:
        return self.query_one(LogLines)

    # -- drawing ---------------------------------------------------------------------------

    def show(self, view: LogView | None) -> None:
        """Draw `view`: only its new lines when it is the one drawn, else all of it, at the
        place it was left."""
        if view is None:
            return
        log = view.log
        if view is not self.view or (log.rewrites, view.level) != self._drawn \
                or log.end < self._end:
            self.remember()
            self.view = view
            self._redraw()
        elif log.end > self._end:
            self._append(max(self._end, log.dropped))
        self._title()

    def remember(self) -> None:
        """Keep the place of the log shown in its view, before another is drawn."""
        view = self.view
        if view is None or not self._seqs:
            return
        lines = self.log_lines
        at_end = lines.is_vertical_scroll_end
        y = int(lines.scroll_y)
        view.top = None if at_end or y >= len(self._seqs) else self._seqs[y]

    def _redraw(self) -> None:
        view = self.view
        assert view is not None
        lines = self.log_lines
        lines.clear()
        self._seqs = []
        self._drawn = (view.log.rewrites, view.level)
        lines.search.pattern = matcher(view.search)
        self._append(view.log.dropped, scroll=False)
        if view.top is None:
            lines.scroll_end(animate=False, immediate=True, x_axis=False)
        else:
            lines.scroll_to(y=bisect_left(self._seqs, view.top), animate=False, immediate=True)

    def _append(self, start: int, scroll: bool = True) -> None:
        """The lines from seq `start` on that pass the level filter."""
        view = self.view
        assert view is not None
        log = view.log
        floor = FILTERS[view.level][0]
        texts: list[str] = []
        for seq in range(start, log.end):
            i = seq - log.dropped
            level = log.levels[i]
            if level >= floor or level == MARK:
                texts.append(shown(log.lines[i], keep_tabs=True))  # escapes shown
                self._seqs.append(seq)
        self._end = log.end
        lines = self.log_lines
        before = len(lines.lines)
        y = lines.scroll_y
        lines.write_lines(texts, scroll_end=None if scroll else False)
        pruned = before + len(texts) - len(lines.lines)
        if pruned > 0:  # the Log keeps MAX_LINES: the oldest went
            del self._seqs[:pruned]
            if scroll and not lines.is_vertical_scroll_end:
                lines.scroll_to(y=max(0, y - pruned), animate=False, immediate=True)

    def _title(self) -> None:
        view = self.view
        assert view is not None
        log = view.log
        parts = [f"{log.name}  ({log.path or log.name})", f"{len(self._seqs):,} lines"
                 + (f" of {len(log.lines):,}" if view.level else ""),
                 "following" if view.follow else "not following (f follows)"]
        if view.level:
            parts.append(f"level {FILTERS[view.level][1]}")
        if view.search:
            found = self.matches()
            where = ""
            if view.match is not None and view.match in found:
                where = f"match {found.index(view.match) + 1} of {len(found)}"
            else:
                where = f"{len(found)} matches"
            parts.append(f"/{view.search}: {where}")
        self.query_one("#log-title", Label).update(shown_markup(" · ".join(parts)))

    # -- search ----------------------------------------------------------------------------

    def matches(self) -> list[int]:
        """The seqs of the lines shown that hold the search."""
        pattern = self.log_lines.search.pattern
        if pattern is None:
            return []
        return [seq for seq, text in zip(self._seqs, self.log_lines.lines, strict=False)
                if pattern.search(text)]

    def _jump(self, direction: int) -> None:
        """To the next match down (1), up (-1), or the newest at or above the view's bottom
        (0), wrapping round."""
        view = self.view
        if view is None or not view.search:
            self.app.bell()
            return
        found = self.matches()
        if not found:
            self.notify(f"no line holds {shown_markup(repr(view.search))}", severity="warning",
                        timeout=3)
            return
        lines = self.log_lines
        if direction == 0 or view.match is None:
            bottom = int(lines.scroll_y) + lines.scrollable_content_region.height - 1
            at = self._seqs[min(bottom, len(self._seqs) - 1)] if self._seqs else 0
            i = bisect_right(found, at) - 1
        elif direction > 0:
            i = bisect_right(found, view.match)
        else:
            i = bisect_left(found, view.match) - 1
        view.match = found[i % len(found)]
        y = bisect_left(self._seqs, view.match)
        lines.scroll_to(y=max(0, y - lines.scrollable_content_region.height // 2),
                        animate=False, immediate=True)
        self._title()

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.add_class("open")
        box.value = self.view.search if self.view is not None else ""
        box.focus()

    def action_next_match(self) -> None:
        self._jump(1)

    def action_previous_match(self) -> None:
        self._jump(-1)

    @on(Input.Changed, "#log-search")
    def _search_changed(self, event: Input.Changed) -> None:
        if self.view is None:
            return
        self.view.search = event.value
        self.view.match = None
        self.log_lines.search.pattern = matcher(event.value)
        self.log_lines.refresh()
        self._title()

    @on(Input.Submitted, "#log-search")
    def _search_done(self, event: Input.Submitted) -> None:
        event.input.remove_class("open")
        self.log_lines.focus()
        self._jump(0)

    def action_clear(self) -> None:
        """Escape: close the search box, or clear the search; with neither, back to the fleet
        (the app's escape)."""
        box = self.query_one("#log-search", Input)
        view = self.view
        if not box.has_class("open") and (view is None or not view.search):
            self.app.call_later(self.app.run_action, "do('fleet')")
            return
        box.remove_class("open")
        box.value = ""  # Input.Changed clears the view's search
        if view is not None:
            view.search, view.match = "", None
            self.log_lines.search.pattern = None
            self.log_lines.refresh()
            self._title()
        self.log_lines.focus()

    # -- follow and level ------------------------------------------------------------------

    def action_follow(self) -> None:
        view = self.view
        if view is None:
            return
        view.follow = not view.follow
        if view.follow:
            view.top = None
            self.log_lines.scroll_end(animate=False, immediate=True, x_axis=False)
        self._title()

    def action_level(self) -> None:
        view = self.view
        if view is None:
            return
        view.level = (view.level + 1) % len(FILTERS)
        self.show(view)
