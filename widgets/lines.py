"""Widgets that draw one no-wrap rich Text through Textual's line API.

Textual's generic path converts a widget's Text to its own Content and wraps it again on
every refresh; for panels that redraw every frame that was most of a frame's cost. Here
each line becomes a Strip straight from rich's segments, once per refresh: truncated when
the Text is no_wrap (the panels size their text to the width), wrapped otherwise.
"""

from __future__ import annotations

from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget


class TextLines(Widget):
    _strips: list[Strip] | None = None
    _strips_key: tuple | None = None

    def render(self) -> Text:  # subclasses draw here
        return Text()

    def refresh(self, *regions, **kw):
        self._strips = None
        return super().refresh(*regions, **kw)

    def _build(self, width: int) -> list[Strip]:
        text = self.render()
        base = self.rich_style
        console = self.app.console
        if text.no_wrap:
            overflow = text.overflow or "crop"
            lines = text.split("\n", allow_blank=True)
            for line in lines:
                if line.cell_len > width:
                    line.truncate(width, overflow=overflow)
        else:
            lines = text.wrap(console, max(1, width))
        return [Strip(list(line.render(console)), line.cell_len).apply_style(base) for line in lines]

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        key = (width, self.content_size.height)
        if self._strips is None or key != self._strips_key:
            self._strips = self._build(width)
            self._strips_key = key
        return self._strips[y] if y < len(self._strips) else Strip.blank(width, self.rich_style)
