"""A Static redrawn from live figures: updated only when its text changed, and laid out only
when its height changed. A Static's update lays the whole screen out again by default (every
widget's box measured, the run panel's grid rendered to learn its height: ~25 ms at 128 nodes),
which at a redraw tick or two a second was most of a node view's cost; a figure that changes
keeps its size."""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence

from rich.cells import cell_len
from rich.console import RenderableType
from rich.text import Text
from textual.widgets import Static

_SPACES = re.compile(r"(\s+)")


def text_key(text: Text) -> Hashable:
    """What is drawn: the characters and every style (Text's == ignores the base style)."""
    return text.plain, str(text.style), tuple(text.spans)


def text_shape(text: Text) -> Hashable:
    """What its size depends on, wherever it wraps: each gap, the width of each word (of each
    of its characters where some are wide) and how it wraps (`12.3 h` and `45.6 h` wrap alike;
    `9 s` and `10 s` may not)."""
    return (text.no_wrap, text.overflow, text.justify, text.tab_size,
            tuple(part if part.isspace() else len(part) if part.isascii()
                  else tuple(cell_len(c) for c in part) for part in _SPACES.split(text.plain)))


class LiveStatic(Static):
    def __init__(self, content: RenderableType = "", *, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(content, id=id, classes=classes)
        self._key: Hashable = None
        self._shape: Hashable = None
        self._measured: tuple[int, int | None] = (0, None)  # (width, content height)

    def draw(self, content: RenderableType, texts: Sequence[Text] | None = None) -> None:
        """Draw `content`, a Text, or a renderable made of `texts` (and of nothing else that
        changes): nothing happens while they are as drawn last."""
        if texts is None:
            texts = [content] if isinstance(content, Text) else []
        key = tuple(text_key(t) for t in texts) if texts else None
        if key is not None and key == self._key:
            return
        shape = tuple(text_shape(t) for t in texts) if texts else None
        sized = self.styles.height is not None and not self.styles.height.is_auto
        may_change = not sized and (shape is None or shape != self._shape)
        self._key, self._shape = key, shape
        self.update(content, layout=False)
        if may_change:  # measured as the layout would: a layout only if the height changed
            width = self.size.width
            size = self.size  # a Static is no container: get_content_height reads only width
            height = self.get_content_height(size, size, width) if width else None
            if height is None or (width, height) != self._measured:
                self.refresh(layout=True)
            self._measured = (width, height)
