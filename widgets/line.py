"""One row of a panel as runs of (text, style): what the panels draw every second, cheaply.

rich's ``Text`` does more than a panel row needs and pays for it on every frame: each
append strips control codes (a per-character table lookup, ~130 characters a sparkline),
styles are spans to be combined, and a panel drawn as one Text is split into lines again.
A ``Line`` is a list of ``(text, style string)`` runs: appending is a list append, the
signature that decides whether a row changed is the tuple of its runs, and its Strip is one
Segment a run. It draws exactly what the same Text would (tests compare the two).

Text from outside reaches a Line only through ``traintop.text`` (``one_line``); the Strip
builder checks each line once more and makes any control character visible.
"""

from __future__ import annotations

import re

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip

from traintop.text import is_clean, one_line

try:  # where rich breaks a line into words; without it, wrapping goes through rich's Text
    from rich._wrap import divide_line
except ImportError:  # pragma: no cover - another rich
    divide_line = None

_TRAILING_SPACE = re.compile(r"\s+$")
# A word runs to the next whitespace other than a no-break space (keep_units joins a number to
# its unit with one: "0\u00a0B/s" is never parted).
_WORD = re.compile(r"[^\S\u00a0]*[\S\u00a0]+[^\S\u00a0]*")


def narrow_breaks(plain: str, width: int) -> list[int]:
    """Where rich's word wrap (``divide_line``, no folding) breaks ``plain`` when every
    character takes one cell: the same rule, measured by length."""
    breaks: list[int] = []
    offset = 0
    for m in _WORD.finditer(plain):
        start, word = m.start(), m.group(0)
        if width - offset >= len(word.rstrip()):
            offset += len(word)
        elif len(word.rstrip()) > width:  # wider than any row: on a row of its own, cut later
            if start:
                breaks.append(start)
            offset = len(word)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return breaks

# Characters the panels draw that take one cell (checked against rich at import): a run of
# these and ASCII is as wide as it is long, without asking rich cell by cell.
_NARROW = "".join(c for c in "▁▂▃▄▅▆▇█▏▎▍▌▋▊▉·–—°↑↓…✔✖▲ℹ•→‖▶●⚠│─×µ\u00a0" if cell_len(c) == 1)
_OTHER = re.compile("[^\x20-\x7e" + re.escape(_NARROW) + "]")


def cells(text: str) -> int:
    """Cells ``text`` takes on a terminal."""
    return cell_len(text) if _OTHER.search(text) else len(text)


class Line:
    """Runs of (text, style string); ``style`` "" draws in the widget's own style."""

    __slots__ = ("runs", "_cells")

    def __init__(self, text: str = "", style: str = "") -> None:
        self.runs: list[tuple[str, str]] = [(text, style)] if text else []
        self._cells: int | None = None

    def append(self, text: str, style: str = "") -> Line:
        if text:
            self.runs.append((text, style))
            self._cells = None
        return self

    def extend(self, other: Line) -> Line:
        """``other``'s runs after this line's (rich's ``append_text``)."""
        if other.runs:
            self.runs.extend(other.runs)
            self._cells = None
        return self

    @property
    def plain(self) -> str:
        return "".join([t for t, _ in self.runs])

    def __str__(self) -> str:
        return self.plain

    def __bool__(self) -> bool:
        return bool(self.runs)

    @property
    def cell_len(self) -> int:
        if self._cells is None:
            self._cells = sum([cells(t) for t, _ in self.runs])
        return self._cells

    def signature(self) -> tuple:
        """Equal for two lines that draw the same."""
        return tuple(self.runs)

    def truncate(self, width: int, ellipsis: bool = True) -> Line:
        """At most ``width`` cells, in place. A cut line ends in "…" in the style of the cell it
        replaces, as rich's ``Text.truncate(width, overflow="ellipsis")`` does; ``ellipsis``
        False crops."""
        if self.cell_len <= width:
            return self
        room = width - 1 if ellipsis else width
        out: list[tuple[str, str]] = []
        for text, style in self.runs:
            w = cells(text)
            if w <= room:
                out.append((text, style))
                room -= w
                if room or ellipsis:
                    continue
                break
            head = set_cell_size(text, room) if room > 0 else ""
            out.append((head + "…" if ellipsis and width > 0 else head, style))
            break
        self.runs = [(t, s) for t, s in out if t]
        self._cells = None
        return self

    def slice(self, start: int, end: int) -> Line:
        """Characters ``start`` to ``end`` with their styles (``text[start:end]``)."""
        out = Line()
        pos = 0
        for text, style in self.runs:
            a, b = max(start - pos, 0), min(end - pos, len(text))
            if a < b:
                out.runs.append((text[a:b], style))
            pos += len(text)
            if pos >= end:
                break
        return out

    def divide(self, offsets: list[int]) -> list[Line]:
        """The line cut at character ``offsets`` (ascending)."""
        pieces: list[Line] = []
        current = Line()
        pos = 0
        cuts = iter(offsets)
        cut = next(cuts, None)
        for text, style in self.runs:
            start = pos
            pos += len(text)
            while cut is not None and cut < pos:
                head = text[: cut - start]
                if head:
                    current.runs.append((head, style))
                pieces.append(current)
                current = Line()
                text, start = text[cut - start:], cut
                cut = next(cuts, None)
            if text:
                current.runs.append((text, style))
        pieces.append(current)
        while cut is not None:  # offsets past the end: empty lines, as rich's divide gives
            pieces.append(Line())
            cut = next(cuts, None)
        return pieces

    def wrap(self, width: int) -> list[Line]:
        """Word-wrapped to ``width`` cells as rich wraps a Text with overflow "ellipsis": breaks
        after whitespace, the spaces that end a row beyond the width dropped, a word wider than
        a row cut with "…"."""
        if divide_line is None:  # pragma: no cover - another rich
            return [from_text(t) for t in fit_lines(self.to_text(overflow="ellipsis"), width, None)]
        plain = self.plain
        breaks = narrow_breaks(plain, width) if cells(plain) == len(plain) \
            else divide_line(plain.replace("\u00a0", "_"), width, fold=False)  # rich breaks at no-break spaces
        rows = self.divide(breaks)
        for row in rows:
            row._rstrip_end(width)
            row.truncate(width)
        return rows

    def _rstrip_end(self, size: int) -> None:
        plain = self.plain
        excess = len(plain) - size
        if excess <= 0:
            return
        space = _TRAILING_SPACE.search(plain)
        if space is None:
            return
        drop = min(len(space.group(0)), excess)
        while drop and self.runs:
            text, style = self.runs[-1]
            if len(text) <= drop:
                self.runs.pop()
                drop -= len(text)
            else:
                self.runs[-1] = (text[: len(text) - drop], style)
                drop = 0
        self._cells = None

    def to_text(self, **kw) -> Text:
        """The same row as a rich Text (wrapping, tests, tools)."""
        text = Text(**kw)
        for t, s in self.runs:
            text.append(t, style=s or None)
        return text


def from_text(text: Text, base: str = "") -> Line:
    """A rich Text of plain spans (one style each, none overlapping) as a Line; ``base`` (and
    the Text's own style) under every run."""
    line = Line()
    plain, pos = text.plain, 0
    base = " ".join(s for s in (base, str(text.style or "")) if s and s != "none")
    for span in sorted(text.spans, key=lambda sp: sp.start):
        if span.start > pos:
            line.append(plain[pos:span.start], base)
        style = str(span.style or "")
        line.append(plain[span.start:span.end], f"{base} {style}".strip() if style != "none" else base)
        pos = max(pos, span.end)
    return line.append(plain[pos:], base)


_COMBINED: dict[tuple, Style] = {}  # (console, base, style text, paint) -> the style a run is drawn in


def _combined(console, base: Style, style: str, paint) -> Style:
    key = (id(console), base, style, paint)
    got = _COMBINED.get(key)
    if got is None:
        if len(_COMBINED) > 4096:
            _COMBINED.clear()
        got = base + console.get_style(style, default=Style.null()) if style else base
        if paint is not None:  # Textual's ANSI-to-true-colour filter, applied once a style
            line_filter, background = paint
            got = line_filter.truecolor_style(got, background.rich_color)
        _COMBINED[key] = got
    return got


def line_strip(line: Line, console, base: Style, paint=None, styles: dict | None = None) -> Strip:
    """``line`` as a Strip in the widget's ``base`` style: the Segments that rich renders for the
    equivalent Text (unstyled neighbours drawn as one, as Text draws them); ``paint``: (Textual's
    ANSI-to-true-colour filter, the widget's background) applied to each style. ``styles``: a
    widget's own map of style text to Style for this ``console``, ``base`` and ``paint``."""
    runs = line.runs
    if not is_clean("".join([t for t, _ in runs]), allow_newline=False):  # never expected: made safe here too
        runs = [(one_line(t), s) for t, s in runs]
        line = Line()
        line.runs = runs
    if styles is None:
        styles = {}
    segments: list[Segment] = []
    last = None
    for text, style in runs:
        if not style and last == "" and segments:
            segments[-1] = Segment(segments[-1].text + text, segments[-1].style)
            continue
        drawn = styles.get(style)
        if drawn is None:
            drawn = styles[style] = _combined(console, base, style, paint)
        segments.append(Segment(text, drawn))
        last = style
    return Strip(segments, line.cell_len)


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
