"""Small rendering helpers shared by the widgets: fixed-scale sparklines and bars."""

from __future__ import annotations

from rich.text import Text

BLOCKS = "▁▂▃▄▅▆▇█"


def spark(values: list, lo: float, hi: float, width: int, style: str = "green",
          none_char: str = " ") -> Text:
    """A one-row sparkline on a fixed [lo, hi] scale (Textual's Sparkline auto-scales)."""
    width = max(0, width)
    vals = values[-width:] if width else []
    pad = width - len(vals)
    text = Text(" " * pad, style="dim")
    span = (hi - lo) or 1.0
    chars = []
    for v in vals:
        if v is None:
            chars.append(none_char)
            continue
        x = (min(max(v, lo), hi) - lo) / span
        chars.append(BLOCKS[min(len(BLOCKS) - 1, int(x * (len(BLOCKS) - 1) + 0.5))] if x > 0 else "▁")
    text.append("".join(chars), style=style)
    return text


def bar(frac: float | None, width: int, style: str = "green") -> Text:
    """A horizontal bar filled to ``frac`` (0..1)."""
    width = max(0, width)
    if frac is None:
        return Text("·" * width, style="dim")
    frac = min(max(frac, 0.0), 1.0)
    full = frac * width
    n = int(full)
    partial = "▏▎▍▌▋▊▉"[int((full - n) * 7)] if n < width and full - n >= 1 / 7 else ""
    text = Text("█" * n + partial, style=style)
    text.append("·" * (width - n - len(partial)), style="bright_black")
    return text


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
