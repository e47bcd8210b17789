"""Small rendering helpers shared by the widgets: fixed-scale sparklines and bars."""

from __future__ import annotations

from traintop.widgets.line import Line

BLOCKS = "▁▂▃▄▅▆▇█"


def _spark_char(v, lo: float, hi: float, span: float, none_char: str) -> str:
    if v is None:
        return none_char
    x = (min(max(v, lo), hi) - lo) / span
    return BLOCKS[min(len(BLOCKS) - 1, int(x * (len(BLOCKS) - 1) + 0.5))] if x > 0 else "▁"


# A sparkline scrolls one column a sample: the new row is the previous one less its first
# character plus one. Rows computed lately, keyed by their values, with what they will be
# asked for next (the values less the oldest one; the values themselves while the row grows).
_ROWS: dict[tuple, str] = {}
_ROWS_MAX = 512


def _spark_chars(vals: list, lo: float, hi: float, none_char: str) -> str:
    span = (hi - lo) or 1.0
    params = (lo, hi, none_char)
    head = _ROWS.get((params, tuple(vals[:-1]))) if vals else None
    if head is not None:
        chars = head + _spark_char(vals[-1], lo, hi, span, none_char)
    else:
        chars = "".join([_spark_char(v, lo, hi, span, none_char) for v in vals])
    if len(_ROWS) >= _ROWS_MAX:
        _ROWS.clear()
    _ROWS[(params, tuple(vals))] = chars
    _ROWS[(params, tuple(vals[1:]))] = chars[1:]
    return chars


def _over(under: str, style: str) -> str:
    """``style`` drawn over ``under`` (a rich style string: the later words win)."""
    return f"{under} {style}" if style and under else (style or under)


def spark(values: list, lo: float, hi: float, width: int, style: str = "green",
          none_char: str = " ") -> Line:
    """A one-row sparkline on a fixed [lo, hi] scale (Textual's Sparkline auto-scales). Drawn
    dim under its colour, the blank start too."""
    width = max(0, width)
    vals = values[-width:] if width else []
    line = Line(" " * (width - len(vals)), "dim")
    return line.append(_spark_chars(vals, lo, hi, none_char), _over("dim", style))


def bar(frac: float | None, width: int, style: str = "green") -> Line:
    """A horizontal bar filled to ``frac`` (0..1)."""
    width = max(0, width)
    if frac is None:
        return Line("·" * width, "dim")
    frac = min(max(frac, 0.0), 1.0)
    full = frac * width
    n = int(full)
    partial = "▏▎▍▌▋▊▉"[int((full - n) * 7)] if n < width and full - n >= 1 / 7 else ""
    line = Line("█" * n + partial, style)
    return line.append("·" * (width - n - len(partial)), _over(style, "bright_black"))


def level_style(frac: float | None, warn: float = 0.8, crit: float = 0.95) -> str:
    if frac is None:
        return "bright_black"
    if frac >= crit:
        return "bold red"
    if frac >= warn:
        return "yellow"
    return "green"


SEVERITY_STYLE = {1: "cyan", 2: "bold yellow", 3: "bold red"}
SEVERITY_ICON = {1: "ℹ", 2: "▲", 3: "✖"}
