"""Memory over time, with plotext: the job's allocated vs reserved GPU memory against the GPU's used
memory (NVML); the job's resident memory on the host."""

from __future__ import annotations

from rich.ansi import AnsiDecoder

from traintop.units import GiB
from traintop.widgets.line import Line, from_text

LEGEND_STYLE = {"orange": "dark_orange"}  # plotext's colour names, in rich's


def _thin(values: list, n: int) -> list:
    """At most ``n`` points: every k-th sample, always keeping the newest."""
    if len(values) <= n:
        return values
    k = -(-len(values) // n)
    return values[::-1][::k][::-1]


SHORT_NAMES_FULL: dict[str, str] = {}
SHORT_NAMES = {"GPU used (NVML)": "NVML", "reserved": "reserved", "allocated": "allocated"}
SHORT_NAMES_TINY = {"GPU used (NVML)": "N", "reserved": "r", "allocated": "a"}


def memory_chart(allocated: list, reserved: list, nvml: list, width: int, height: int) -> list[Line]:
    """A plotext line chart's rows (GiB on the y axis, samples on the x axis), under a line
    naming the unit and the series: plotext draws its legend over the data."""
    return chart([("GPU used (NVML)", nvml, "red"), ("reserved", reserved, "orange"), ("allocated", allocated, "green")],
                 width, height, (SHORT_NAMES_FULL, SHORT_NAMES, SHORT_NAMES_TINY))


RSS_NAMES = ({}, {"RSS of the job's processes (host memory)": "RSS (host memory)"},
             {"RSS of the job's processes (host memory)": "RSS"})


def rss_chart(rss: list, width: int, height: int) -> list[Line]:
    """The job's resident memory on the host over time: a leak in its Python or its loader workers."""
    return chart([("RSS of the job's processes (host memory)", rss, "cyan")], width, height, RSS_NAMES)


def chart(series: list[tuple[str, list, str]], width: int, height: int, legends) -> list[Line]:
    """(label, byte values, plotext colour) series as a chart in GiB; ``legends``: the label
    renamings to try, in turn, until the legend line fits."""
    import plotext as plt  # here, not at start-up: ~3 MiB of RSS that a dashboard without a probed job never needs
    plt.clf()
    plt.plotsize(max(20, width - 1), max(5, height - 1))  # the legend line takes one
    plt.theme("clear")
    plt.xticks([])
    cols = 2 * max(20, width - 8)  # braille: two dots a column; more points only cost time
    drawn = False
    legend: list[tuple[str, str]] = []
    for label, values, color in series:
        pts = [(i, v / GiB) for i, v in enumerate(_thin(values, cols)) if v is not None]
        if len(pts) >= 2:
            xs, ys = zip(*pts)
            plt.plot(xs, ys, color=color, marker="braille")
            drawn = True
            legend.append((label, color))
    if not drawn:
        return [Line("collecting memory figures…", "dim")]
    # The legend whole, else with short names, else the marks alone with initials: never a
    # name cut off ("━ alloca").
    for names in legends:
        head = Line("GiB", "bold")  # the chart is drawn in bold: its braille lines read thicker
        for label, color in legend:
            gap = "  ━ " if names is not legends[-1] else " ━"
            head.append(gap, f"bold {LEGEND_STYLE.get(color, color)}").append(names.get(label, label), "bold dim")
        if head.cell_len <= width:
            break
    out = [head.truncate(width, ellipsis=False)]
    decoder = AnsiDecoder()  # one row at a time: rich's from_ansi joins and splits them again
    for row in plt.build().splitlines():  # never wider than the panel
        out.append(from_text(decoder.decode_line(row), "bold").truncate(width, ellipsis=False))
    return out
