"""Word wrap with a hanging indent, breaking only at plain spaces (never inside a number and its unit)."""

from __future__ import annotations

import re

from functools import lru_cache

from rich.cells import cell_len
from rich.text import Text

from traintop.widgets.line import Line, cells

NBSP = "\u00a0"
# a number, then a space, then its unit: the space becomes a no-break space
_UNIT = re.compile(r"(?<=\d) (?=(?:%|°C|[KMGT]i?B(?:/s)?|B/s|B|kW|W|ms|µs|s|min|h|MHz|GHz|×|x|steps/s|cores?)(?![\w/]))")
_LABEL = re.compile(r"\b(GPU|rank|PID) (?=\d)")  # "GPU 0" stays on one line too


@lru_cache(maxsize=512)  # the same sentences come back every second
def keep_units(text: str) -> str:
    """``text`` with no-break spaces between numbers and their units ("22 GiB", "GPU 0")."""
    return _LABEL.sub(r"\1" + NBSP, _UNIT.sub(NBSP, text))


def _fit(plain: str, start: int, width: int) -> int:
    """The end of the longest prefix of ``plain[start:]`` no wider than ``width`` cells (at least one char)."""
    end = start
    used = 0
    while end < len(plain):
        w = cell_len(plain[end])
        if used + w > width and end > start:
            break
        used += w
        end += 1
    return end


def hang_rows(plain: str, width: int, hang: int = 0) -> list[tuple[int, int, int]]:
    """Where ``plain`` (one line) breaks into rows of at most ``width`` cells whose continuation
    rows start with ``hang`` spaces: (start, end, spaces before) a row."""
    width = max(1, width)
    hang = min(hang, width // 2)
    words = [(m.start(), m.end()) for m in re.finditer(r"[^ ]+", plain)]
    if not words:
        return [(0, len(plain), 0)]
    # a text of one-cell characters (nearly always) is as wide as it is long
    span = (lambda a, b: b - a) if cells(plain) == len(plain) else (lambda a, b: cell_len(plain[a:b]))
    rows = []
    first = True
    i = 0
    while i < len(words):
        avail = width if first else width - hang
        line_start = 0 if first else words[i][0]  # the first line keeps the paragraph's indent
        end = words[i][1]
        if span(line_start, end) > avail:  # one word wider than the line: cut it
            end = _fit(plain, line_start, avail)
            if end < words[i][1]:
                words[i] = (end, words[i][1])
            else:
                i += 1
        else:
            i += 1
            while i < len(words) and span(line_start, words[i][1]) <= avail:
                end = words[i][1]
                i += 1
        rows.append((line_start, end, 0 if first else hang))
        first = False
    return rows


def hang_wrap(text: Text | Line, width: int, hang: int = 0) -> list:
    """Lines of at most ``width`` cells; continuation lines start with ``hang`` spaces. A Text
    gives Texts (its newlines start new paragraphs), a Line gives Lines."""
    if isinstance(text, Line):
        plain = text.plain
        if not plain:
            return [Line()]
        return [(Line(" " * prefix) if prefix else Line()).extend(text.slice(a, b))
                for a, b, prefix in hang_rows(plain, width, hang)]
    out: list[Text] = []
    for para in text.split("\n", allow_blank=True):
        plain = para.plain
        if not plain:
            out.append(Text())
            continue
        if not plain.strip(" "):
            out.append(para.copy())
            continue
        for a, b, prefix in hang_rows(plain, width, hang):
            piece = para[a:b]
            out.append(Text(" " * prefix) + piece if prefix else piece)
    return out


def cut_words(text: Text, width: int) -> Text:
    """``text`` in at most ``width`` cells, cut after a whole word with "…" (mid-word only when
    its first word alone does not fit)."""
    if text.cell_len <= width:
        return text
    if width <= 1:
        return Text("…"[:max(0, width)])
    plain = text.plain
    end = _fit(plain, 0, width - 1)
    space = plain.rfind(" ", 0, end + 1)
    if space > 0 and plain[:space].strip(" ") and plain[:space].rstrip(" ")[-1:] not in "▲✖ℹ•":
        end = space
    out = text[:end]
    out.rstrip()
    out.append("…", style=text.style)
    return out
