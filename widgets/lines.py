"""Widgets that draw rich Text through Textual's line API, repainting only the lines that changed.

Textual's generic path converts a widget's Text to its own Content and wraps it again on
every refresh, and a refresh repaints every line of the widget, border and padding
included. traintop changes a small part of the screen each second, so a panel here keeps
one Strip per line with a cheap signature of the Text it came from; ``redraw()`` renders
the panel's Text, compares the signatures and repaints only the lines that differ (nothing
at all when none does). A line is truncated when the Text is no_wrap (the panels size
their text to the width), wrapped otherwise.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget


def line_signature(line: Text) -> tuple:
    """Equal for two lines that draw the same (text, styles), cheap next to drawing one."""
    return line.plain, str(line.style), tuple(line.spans), line.end


def fit_lines(text: Text, width: int, console) -> list[Text]:
    """``text`` as lines of at most ``width`` cells: truncated when it is no_wrap, wrapped otherwise."""
    lines = text.split("\n", allow_blank=True)
    if text.no_wrap:
        overflow = text.overflow or "crop"
        for line in lines:
            if line.cell_len > width:
                line.truncate(width, overflow=overflow)
        return lines
    # Text.wrap wraps each line on its own; a line that fits comes back as it is, so only the
    # long ones pay for it (most of a panel's lines fit).
    width = max(1, width)
    out: list[Text] = []
    for line in lines:
        if line.cell_len <= width and not (text.justify and text.justify not in ("default", "left")):
            out.append(line)
        else:
            out.extend(line.wrap(console, width, justify=text.justify, overflow=text.overflow))
    return out


_STYLES: dict[tuple, Style] = {}  # (console, style text) -> Style: parsed once, not per line and frame


def _style(console, style) -> Style:
    if isinstance(style, Style):
        return style
    key = (id(console), style)
    got = _STYLES.get(key)
    if got is None:
        if len(_STYLES) > 4096:
            _STYLES.clear()
        got = _STYLES[key] = console.get_style(style, default=Style.null())
    return got


def text_strip(line: Text, console, base: Style) -> Strip:
    """``line`` as a Strip in the widget's ``base`` style: the segments ``Text.render`` makes
    (a span's style over the line's, spans combined in their order), built in one pass with
    the styles parsed once, and the base applied as they are made rather than by a second Strip."""
    plain, spans = line.plain, line.spans
    n = len(plain)
    root = base + _style(console, line.style) if line.style else base
    if not spans:
        return Strip([Segment(plain, root)], line.cell_len)
    if any(not 0 <= sp.start <= sp.end <= n for sp in spans):  # not made by append: rich's own way
        return Strip(list(line.render(console)), line.cell_len).apply_style(base)
    styles = [_style(console, sp.style) for sp in spans]
    bounds = sorted({0, n, *(sp.start for sp in spans), *(sp.end for sp in spans)})
    combined: dict[tuple, Style] = {}
    segments = []
    for a, b in zip(bounds, bounds[1:]):
        key = tuple(i for i, sp in enumerate(spans) if sp.start <= a < sp.end)
        style = combined.get(key)
        if style is None:
            style = root
            for i in key:
                style = style + styles[i]
            combined[key] = style
        segments.append(Segment(plain[a:b], style))
    return Strip(segments, line.cell_len)


class TextLines(Widget):
    _strips: list[Strip] | None = None
    _signatures: list[tuple] | None = None
    _strips_key: tuple | None = None
    _base = None  # the widget's rich style when the strips were built

    def render(self) -> Text:  # subclasses draw here
        return Text()

    def text_lines(self, width: int) -> list[Text]:
        """The widget's lines at ``width`` cells; a subclass that already holds lines may override it."""
        return fit_lines(self.render(), width, self.app.console)

    def refresh(self, *regions, **kw):
        if not regions:  # a full repaint (style, size, or a redraw that changed every line)
            self._strips = None
        return super().refresh(*regions, **kw)

    def redraw(self) -> None:
        """Show the current state: repaint the lines whose Text changed, and only those."""
        width, height = self.content_size
        if self._strips is None or (width, height) != self._strips_key or not self.is_mounted:
            self.refresh()  # nothing to compare with: draw it all when Textual asks for lines
            return
        lines = self.text_lines(width)
        signatures = [line_signature(line) for line in lines]
        old = self._signatures
        if len(signatures) != len(old):
            self._strips = None
            self.refresh(layout=self.styles.height is not None and self.styles.height.is_auto)
            return
        changed = [y for y, (a, b) in enumerate(zip(signatures, old)) if a != b]
        if not changed:
            return
        console, base = self.app.console, self._base  # a style change repaints it all (refresh())
        for y in changed:
            self._strips[y] = self._strip(lines[y], console, base)
        self._signatures = signatures
        runs: list[list[int]] = []  # adjacent changed lines: one region each run
        for y in changed:
            if y >= height:
                break
            if runs and runs[-1][1] == y:
                runs[-1][1] = y + 1
            else:
                runs.append([y, y + 1])
        if runs:
            self.refresh(*(Region(0, a, width, b - a) for a, b in runs))

    @staticmethod
    def _strip(line: Text, console, base) -> Strip:
        return text_strip(line, console, base)

    def _build(self, width: int) -> None:
        lines = self.text_lines(width)
        console, base = self.app.console, self.rich_style
        self._base = base
        self._signatures = [line_signature(line) for line in lines]
        self._strips = [self._strip(line, console, base) for line in lines]

    def render_line(self, y: int) -> Strip:
        width, height = self.content_size
        if self._strips is None or (width, height) != self._strips_key:
            self._build(width)
            self._strips_key = (width, height)
        return self._strips[y] if y < len(self._strips) else Strip.blank(width, self.rich_style)
