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
from textual.filter import ANSIToTruecolor
from textual.dom import NoScreen
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from traintop.widgets.line import Line, cells, fit_lines, line_strip

# False once Textual's styles cache turned out to differ inside: every widget then draws
# through Textual's own path for good (see TextLines.render_lines).
FAST_FRAME = [True]
DIRECT_REPAINT = [True]  # False once a panel could not mark itself dirty on the screen (see _repaint_rows)
_FRAME_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError)


def line_signature(line: Text | Line) -> tuple:
    """Equal for two lines that draw the same (text, styles), cheap next to drawing one."""
    if isinstance(line, Line):
        return line.signature()
    return line.plain, str(line.style), tuple(line.spans), line.end


def fit(line: Line, width: int, console, wrap: bool = False) -> list[Text | Line]:
    """``line`` in rows of at most ``width`` cells: cut with "…", or wrapped (rich's wrap) when
    ``wrap``; a line that fits comes back as it is."""
    if line.cell_len <= width:
        return [line]
    if wrap:  # a word too long for a row is cut with "…", not folded
        return line.wrap(max(1, width))
    return [line.truncate(width)]


def fit_parts(head: Line, parts: list[Line], width: int, sep: str = " · ") -> Line:
    """``head``, then as many of ``parts`` as fit in ``width`` cells, whole, in their order (most
    important first), "sep" between them; " …" says that some were left out. Only a head too wide
    for the row is cut."""
    if head.cell_len >= width:
        return head.truncate(width)
    out = Line().extend(head)
    used, gap, more = head.cell_len, cells(sep), " …"
    for k, part in enumerate(parts):
        room = width - (0 if k == len(parts) - 1 else len(more))  # the mark fits after any part shown
        if used + gap + part.cell_len > room:
            return out.append(more, "dim") if used + len(more) <= width else out
        out.append(sep).extend(part)
        used += gap + part.cell_len
    return out


def join_lines(lines: list[Text | Line]) -> Text:
    """A panel's rows as one Text (tests and tools read ``render()``)."""
    out = Text("\n").join(line.to_text() if isinstance(line, Line) else line for line in lines)
    out.no_wrap, out.overflow = True, "ellipsis"
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


def paint_strip(strip: Strip, line_filter: ANSIToTruecolor, background) -> Strip:
    """``strip`` through Textual's ANSI-to-true-colour filter, each style converted once."""
    convert, bg = line_filter.truecolor_style, background.rich_color
    return Strip([Segment(text, None if style is None else convert(style, bg), control)
                  for text, style, control in strip._segments], strip._cell_length)


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


def _truecolor_filter(widget: Widget):
    """Textual's only line filter in a colour terminal (ANSI colours as the theme's true
    colours), when it is the only one: a panel can apply it once, when it builds a line."""
    filters = widget.get_line_filters()
    if len(filters) == 1 and type(filters[0]) is ANSIToTruecolor:
        return filters[0]
    return None


class _Frame:
    """A content row's border and padding as Textual drew them, until the next full paint."""

    __slots__ = ("size", "left", "right", "top", "bottom", "content_width", "pad_style", "painted")

    def __init__(self, size, left, right, top, bottom, pad_style, painted) -> None:
        self.size, self.left, self.right, self.top, self.bottom = size, left, right, top, bottom
        self.content_width = size[0] - sum(seg.cell_length for seg in left) - sum(seg.cell_length for seg in right)
        self.pad_style = pad_style
        self.painted = painted  # True: the parts, the padding and the content lines are filtered already


def compose_line(frame: _Frame, line: Strip) -> Strip:
    """A content line inside the frame: border and padding, the line (padded or cut to the
    content width), padding and border."""
    short = frame.content_width - line.cell_length
    if short > 0:
        segments = [*line._segments, Segment(" " * short, frame.pad_style)]
    else:
        segments = line._segments if short == 0 else line.crop(0, frame.content_width)._segments
    return Strip([*frame.left, *segments, *frame.right], frame.size[0])


class TextLines(Widget):
    _strips: list[Strip] | None = None
    _signatures: list[tuple] | None = None
    _strips_key: tuple | None = None
    _base = None  # the widget's rich style when the strips were built
    _paint = None  # (filter, background) applied to the strips as they were built, or None
    _styles: dict | None = None
    _frame: _Frame | None = None
    _framed: dict | None = None  # row -> the line composed here (filtered when the frame is painted)

    def render(self) -> Text:  # subclasses draw here
        return Text()

    def text_lines(self, width: int) -> list[Text]:
        """The widget's lines at ``width`` cells; a subclass that already holds lines may override it."""
        return fit_lines(self.render(), width, self.app.console)

    # Textual's content_size and region look the widget up in the screen's map (a walk up to the
    # screen, then a dict), several times a frame for each panel; its own size (border and
    # padding included) is at hand.
    def _content(self) -> tuple[int, int]:
        width, height = self.outer_size
        gutter = self.styles.gutter
        return max(0, width - gutter.left - gutter.right), max(0, height - gutter.top - gutter.bottom)

    def refresh(self, *regions, **kw):
        if not regions:  # a full repaint (style, size, or a redraw that changed every line)
            self._strips = None
            self._frame = None
        return super().refresh(*regions, **kw)

    def redraw(self) -> None:
        """Show the current state: repaint the lines whose Text changed, and only those."""
        width, height = self._content()
        auto = self.styles.height is not None and self.styles.height.is_auto
        if self._strips is None or (width, height) != self._strips_key or not self.is_mounted:
            # Nothing to compare with: draw it all when Textual asks for lines. A panel as tall as
            # its text whose line count changed is laid out again, or it keeps its old height
            # (the cluster's findings stayed 0 rows tall under "Findings (3 active)" until a resize).
            relayout = auto and self.is_mounted and len(self.text_lines(width)) != height
            self.refresh(layout=relayout)
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
        console, base, paint = self.app.console, self._base, self._paint  # a style change repaints it all
        for y in changed:
            self._strips[y] = self._strip(lines[y], console, base, paint, self._styles)
        self._signatures = signatures
        runs: list[list[int]] = []  # adjacent changed lines: one region each run
        for y in changed:
            if y >= height:
                break
            if runs and runs[-1][1] == y:
                runs[-1][1] = y + 1
            else:
                runs.append([y, y + 1])
        if runs:  # whole rows, border and padding too: the terminal gets each row as one piece, uncut
            left, outer = self.styles.gutter.left, self.outer_size.width
            self._repaint_rows([Region(-left, a, outer, b - a) for a, b in runs])

    def _repaint_rows(self, regions: list[Region]) -> None:
        """Repaint ``regions`` (content coordinates) of this widget, size and styles unchanged.

        ``refresh(*regions)`` wakes the widget's own message loop (a Prompt, then Idle) only for it
        to post an Update to the screen, which marks the widget dirty: three messages and a task
        switch a panel a frame. Here the widget is marked dirty on the screen directly, as
        Screen's Update handler does. Where Textual differs inside, ``refresh`` does it."""
        if DIRECT_REPAINT[0]:
            try:
                screen = self.screen
                if self.display and self in screen._compositor:
                    self._set_dirty(*regions)
                    screen._dirty_widgets.add(self)
                    screen.check_idle()
                    return
            except NoScreen:  # being removed: Textual's own path decides
                pass
            except _FRAME_ERRORS:
                DIRECT_REPAINT[0] = False
        self.refresh(*regions)

    @staticmethod
    def _strip(line: Text | Line, console, base, paint=None, styles: dict | None = None) -> Strip:
        if isinstance(line, Line):
            return line_strip(line, console, base, paint, styles)
        strip = text_strip(line, console, base)
        return strip if paint is None else paint_strip(strip, *paint)

    def _build(self, width: int) -> None:
        lines = self.text_lines(width)
        console, base = self.app.console, self.rich_style
        self._base = base
        painter = _truecolor_filter(self) if FAST_FRAME[0] else None
        self._paint = paint = None if painter is None else (painter, self.background_colors[1])
        self._styles = styles = {}  # style text -> the Style drawn, for this base and paint
        self._signatures = [line_signature(line) for line in lines]
        self._strips = [self._strip(line, console, base, paint, styles) for line in lines]

    # -- the frame around changed lines -----------------------------------------------
    # Textual's styles cache composes every repainted line anew: border, padding, content
    # (lengthened to the width), text opacity, hatch, tint and opacity, ~30 attribute and
    # style lookups a line, then its line filters make a second copy. Between two full
    # paints a panel's border and padding do not change, so a changed content line here is
    # the frame Textual drew for a content row around the new content, stored where Textual
    # keeps its lines (so Textual's own paths, a full paint and its crops, see the same
    # lines). In a colour terminal the one filter (ANSI colours to the theme's) is applied
    # to each style once, when a line is built, instead of to every segment of every frame;
    # applying it again is a no-op. Anything this does not cover (tint, opacity, text
    # opacity, hatch, outline, links, other filters, a border or padding row to redraw)
    # goes through Textual's own path.
    def render_lines(self, crop: Region) -> list[Strip]:
        if FAST_FRAME[0]:
            try:
                strips = self._render_lines_framed(crop)
            except _FRAME_ERRORS:
                FAST_FRAME[0] = False
                self._frame = None
                self._styles_cache.clear()  # whatever it stored, Textual draws it all again
            else:
                if strips is not None:
                    return strips
        strips = super().render_lines(crop)
        if FAST_FRAME[0]:
            try:
                self._capture_frame()
            except _FRAME_ERRORS:
                FAST_FRAME[0] = False
                self._frame = None
        return strips

    def _plain_frame(self) -> bool:
        styles = self.styles
        if styles.tint.a or styles.text_opacity != 1.0 or self.opacity != 1.0:
            return False
        if styles.has_rule("hatch") and styles.hatch != "none":
            return False
        if any(edge for edge, _ in styles.outline):
            return False
        return not (self.auto_links and self.hover_style._link_id)

    def _capture_frame(self) -> None:
        self._frame = None
        cache = self._styles_cache
        width, height = self.region.size  # what Textual's styles cache draws: border and padding included
        if (width, height) != tuple(self.outer_size):
            return
        gutter = self.styles.gutter
        top, bottom = gutter.top, gutter.bottom
        if top >= height - bottom or width <= gutter.left + gutter.right or cache._width != width:
            return
        row = cache._cache.get(top)
        if row is None or top in cache._dirty_lines or row.cell_length != width or not self._plain_frame():
            return
        left, _, right = row.divide([gutter.left, width - gutter.right, width])
        if left.cell_length != gutter.left or right.cell_length != gutter.right:
            return
        base_background, background = self.background_colors
        pad = cache.get_inner_outer(base_background, background)[0].rich_style
        paint = self._paint
        painted = paint is not None and _truecolor_filter(self) is paint[0] and paint[1] == background
        if painted:
            left, right = paint_strip(left, *paint), paint_strip(right, *paint)
            pad = paint[0].truecolor_style(pad, background.rich_color)
        self._frame = _Frame((width, height), list(left), list(right), top, bottom, pad, painted)
        self._framed = {}

    def _render_lines_framed(self, crop: Region) -> list[Strip] | None:
        frame = self._frame
        if frame is None:
            return None
        width, height = size = self.outer_size  # as region.size, checked when the frame was captured
        cache = self._styles_cache
        if frame.size != size or cache._width != width:
            return None
        lines, dirty, framed = cache._cache, cache._dirty_lines, self._framed
        rows = crop.line_range
        todo = [y for y in rows if y in dirty or y not in lines]
        if todo:
            top, bottom = frame.top, height - frame.bottom
            if any(not top <= y < bottom for y in todo):
                return None  # a border or padding row: Textual's own path (styles were checked at capture)
            content_width = frame.content_width
            if self._strips is None or self._strips_key != (content_width, bottom - top):
                return None
            for y in todo:
                lines[y] = framed[y] = compose_line(frame, self.render_line(y - top))  # the line API, as Textual asks it
            dirty.difference_update(rows)
        out = []
        filters = None
        painted = frame.painted
        for y in rows:
            strip = lines[y]
            if not (painted and framed.get(y) is strip):  # a line Textual drew: its filters, as Textual does
                if filters is None:
                    filters, background = self.get_line_filters(), self.background_colors[1]
                for line_filter in filters:
                    strip = strip.apply_filter(line_filter, background)
            out.append(strip)
        if crop.column_span != (0, width):
            x1, x2 = crop.column_span
            out = [strip.crop(x1, x2) for strip in out]
        return out

    def render_line(self, y: int) -> Strip:
        width, height = self._content()
        if self._strips is None or (width, height) != self._strips_key:
            self._build(width)
            self._strips_key = (width, height)
        return self._strips[y] if y < len(self._strips) else Strip.blank(width, self.rich_style)
