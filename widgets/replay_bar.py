"""Replay position: a bar across the recording, with time and speed."""

from __future__ import annotations

from rich.text import Text
from traintop.widgets.line import Line
from traintop.widgets.lines import TextLines, join_lines

from traintop.units import fmt_duration
from traintop.widgets.render import bar


class ReplayBar(TextLines):
    def __init__(self, **kw) -> None:
        super().__init__(id="replay-bar", **kw)
        self.start = self.end = self.position = None
        self.speed = 1.0
        self.playing = False

    def show(self, start: float | None, end: float | None, position: float | None, speed: float,
             playing: bool) -> None:
        self.start, self.end, self.position, self.speed, self.playing = start, end, position, speed, playing
        self.redraw()

    def text_lines(self, width: int) -> list[Line]:
        if self.start is None or self.position is None:
            return [Line("empty recording", "dim").truncate(width)]
        total = max(self.end - self.start, 1e-9)
        done = self.position - self.start
        out = Line("▶ " if self.playing else "‖ ", "bold cyan")
        # The position is as wide as the widest it can be, so the bar keeps its length as it
        # plays; no clock here: the top line has the shown sample's (two clocks disagreed).
        widest = max(len(fmt_duration(v)) for v in (total, min(total, 59), min(total, 3599)))
        label = f" {fmt_duration(done).rjust(widest)} / {fmt_duration(total)}  {self.speed:g}×"
        bar_w = max(10, (self.size.width or 80) - len(label) - 3)
        out.extend(bar(done / total, bar_w, "cyan")).append(label)
        return [out.truncate(width)]

    def render(self) -> Text:
        """The bar as a Text (tests and tools)."""
        return join_lines(self.text_lines(self.size.width or 80))
