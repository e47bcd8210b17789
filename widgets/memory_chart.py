"""Memory over time, drawn in braille: the job's allocated vs reserved GPU memory against the
GPU's used memory (NVML); the job's resident memory on the host.

Drawn here rather than by a plotting library: plotext took 15-55 ms a chart, more than the rest
of a frame, for what is a few hundred dots; this takes about a millisecond (bench/chart_cost.py)."""

from __future__ import annotations

from traintop.units import GiB
from traintop.widgets.line import Line

SHORT_NAMES_FULL: dict[str, str] = {}
SHORT_NAMES = {"GPU used (NVML)": "NVML", "reserved": "reserved", "allocated": "allocated"}
SHORT_NAMES_TINY = {"GPU used (NVML)": "N", "reserved": "r", "allocated": "a"}
RSS_NAMES = ({}, {"RSS of the job's processes (host memory)": "RSS (host memory)"},
             {"RSS of the job's processes (host memory)": "RSS"})

# A braille cell is 2 dots wide and 4 high; bit of the dot at (column, row) in the cell.
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
TICK_EVERY_ROWS = 3  # a labelled tick on the axis every this many rows
MIN_SPAN_GIB = 0.1  # a flat line is drawn in a band this tall, not blown up to the full height


def _thin(values: list, n: int) -> list:
    """At most ``n`` points: every k-th sample, always keeping the newest."""
    if len(values) <= n:
        return values
    k = -(-len(values) // n)
    return values[::-1][::k][::-1]


def memory_chart(allocated: list, reserved: list, nvml: list, width: int, height: int) -> list[Line]:
    """The chart's rows (GiB on the y axis, samples on the x axis, the newest at the right), under
    a line naming the unit and the series."""
    return chart([("GPU used (NVML)", nvml, "red"), ("reserved", reserved, "dark_orange"),
                  ("allocated", allocated, "green")],
                 width, height, (SHORT_NAMES_FULL, SHORT_NAMES, SHORT_NAMES_TINY))


def rss_chart(rss: list, width: int, height: int) -> list[Line]:
    """The job's resident memory on the host over time: a leak in its Python or its loader workers."""
    return chart([("RSS of the job's processes (host memory)", rss, "cyan")], width, height, RSS_NAMES)


def _label(v: float, digits: int = 1) -> str:
    return f"{v:.{digits}f}" if v < 100 else f"{v:.0f}"


def _digits(step: float) -> int:
    """Decimals enough for ticks ``step`` GiB apart to read differently (1 to 3)."""
    digits = 1
    while digits < 3 and step < 10 ** -digits * 1.5:
        digits += 1
    return digits


def _legend(drawn: list[tuple[str, str]], width: int, legends) -> Line:
    """The legend whole, else with short names, else the marks alone with initials: never a name
    cut off ("━ alloca")."""
    for names in legends:
        head = Line("GiB", "bold")
        for label, color in drawn:
            gap = "  ━ " if names is not legends[-1] else " ━"
            head.append(gap, f"bold {color}").append(names.get(label, label), "bold dim")
        if head.cell_len <= width:
            break
    return head.truncate(width, ellipsis=False)


def chart(series: list[tuple[str, list, str]], width: int, height: int, legends) -> list[Line]:
    """(label, byte values, rich colour) series as a line chart in GiB, at most ``width`` cells by
    ``height`` rows; ``legends``: the label renamings to try, in turn, until the legend line fits.
    A later series is drawn over an earlier one where they share a cell."""
    rows = max(3, height - 2)  # the legend above, the x axis below
    points = []
    for label, values, color in series:
        ys = [v / GiB for v in values if v is not None]
        if len(ys) >= 2:
            points.append((label, ys, color))
    if not points:
        return [Line("collecting memory figures…", "dim")]
    lo = min(min(ys) for _, ys, _ in points)
    hi = max(max(ys) for _, ys, _ in points)
    if hi - lo < MIN_SPAN_GIB:
        mid = (hi + lo) / 2
        lo, hi = mid - MIN_SPAN_GIB / 2, mid + MIN_SPAN_GIB / 2
    pad = (hi - lo) * 0.05
    lo, hi = max(0.0, lo - pad), hi + pad
    ticks = {r: lo + (hi - lo) * (rows - 1 - r) / (rows - 1) for r in range(rows) if (rows - 1 - r) % TICK_EVERY_ROWS == 0}
    digits = _digits((hi - lo) * TICK_EVERY_ROWS / (rows - 1))
    label_w = max(len(_label(v, digits)) for v in ticks.values())
    cols = max(4, width - label_w - 1)
    dots_x, dots_y = 2 * cols, 4 * rows
    scale = (dots_y - 1) / (hi - lo)
    cells: dict[tuple[int, int], list] = {}  # (row, column) -> [bits, colour]
    for _, ys, color in points:
        n = len(ys)
        prev = None
        for x in range(dots_x):  # each dot column: the samples it spans, joined to the column before
            a = x * n // dots_x
            span = ys[a:max(a + 1, (x + 1) * n // dots_x)]
            top = dots_y - 1 - round((max(span) - lo) * scale)  # dot rows from the top
            bottom = dots_y - 1 - round((min(span) - lo) * scale)
            if prev is not None:
                top, bottom = min(top, prev + 1 if prev < top else top), max(bottom, prev - 1 if prev > bottom else bottom)
            for dy in range(top, bottom + 1):
                cell = cells.setdefault((dy >> 2, x >> 1), [0, color])
                cell[0] |= _DOT[x & 1][dy & 3]
                cell[1] = color
            prev = dots_y - 1 - round((span[-1] - lo) * scale)
    out = [_legend([(label, color) for label, _, color in points], width, legends)]
    for r in range(rows):
        tick = ticks.get(r)
        line = Line(f"{_label(tick, digits):>{label_w}}┤" if tick is not None else " " * label_w + "│", "dim")
        run, run_color = [], None
        for c in range(cols):
            cell = cells.get((r, c))
            ch, color = (chr(0x2800 + cell[0]), cell[1]) if cell else (" ", None)
            if color != run_color and run:
                line.append("".join(run), f"bold {run_color}" if run_color else "")
                run = []
            run_color = color
            run.append(ch)
        if run and run_color:
            line.append("".join(run), f"bold {run_color}")
        out.append(line)
    out.append(Line(" " * label_w + "└" + "─" * cols, "dim"))
    return out
