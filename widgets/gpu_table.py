"""Every GPU on one line each: used when the full panels do not fit (8 or 16 GPUs, a small pane)."""

from __future__ import annotations

from rich.text import Text

from traintop.text import one_line
from traintop.units import GiB
from traintop.reports.view import GpuView
from traintop.widgets.line import Line
from traintop.widgets.lines import TextLines, join_lines
from traintop.widgets.owner_text import proc_text
from traintop.widgets.render import SEVERITY_ICON, SEVERITY_STYLE, level_style, spark
from traintop.widgets.wrap import cut_words


def _n(v, fmt: str = "{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def alert_mark(level: int, title: str | None) -> Line:
    """The GPU's worst active alert: ✖ critical, ▲ warning, ℹ information."""
    if not level:
        return Line()
    return Line(f"{SEVERITY_ICON.get(level, '•')} {one_line(title or '', 200)}".rstrip(), SEVERITY_STYLE.get(level, ""))


def cut_mark(mark: Line, width: int) -> Line:
    """An alert mark (one run) in at most ``width`` cells, cut after a whole word."""
    if mark.cell_len <= width or not mark.runs:
        return mark
    text, style = mark.runs[0]
    return Line(cut_words(Text(text), width).plain, style)


def owners_brief(v: GpuView) -> str:
    """Whose the busiest process is, "PID 4242 alice · slurm 81234.0 (+1)"; "" where nobody looked."""
    if not v.procs or v.procs[0].owner is None:
        return ""
    more = f" (+{len(v.procs) - 1})" if len(v.procs) > 1 else ""
    return proc_text(v.procs[0], figures=False) + more


OWNER_W = 40  # cells of the table's owner that take room from the history
SPARK_MIN = 3  # narrower than this, the history says nothing: none at all


def spark_width(width: int, wide: bool, numbers_w: int, mark_w: int = 0) -> int:
    """The history's width: what the label and numbers (``numbers_w`` cells) and the widest
    alert mark (``mark_w``, its gap included) leave, up to a cap. The alert's title comes
    first: the history shrinks, down to none, before a title is cut."""
    reserve = 24 if wide else 16  # room kept for a mark even with none, so one appearing moves nothing
    room = width - numbers_w - 1 - max(mark_w, reserve)
    if room >= 6:
        return min(60 if wide else 20, room)
    room = width - numbers_w - 1 - mark_w
    if room >= 6 or not mark_w:
        return 6
    return room if room >= SPARK_MIN else 0


def _row_name(v: GpuView) -> str:
    """What follows "GPU": its index, or for a MIG device "0 MIG 1g.18gb #1" (the driver's text, made safe)."""
    return one_line(v.info.label[4:], 40) if v.info.parent is not None else str(v.sample.index)


def gpu_row(v: GpuView, sw: int, sm: bool, wide: bool, idx_w: int = 1, width: int | None = None,
            marks: bool = True) -> Line:
    s = v.sample
    total = s.mem_total or v.info.mem_total
    limit = s.power_limit_w or v.info.power_limit_w
    slowdown = s.temp_slowdown_c or v.info.temp_slowdown_c or 90.0
    used = None if s.mem_used is None else s.mem_used / GiB
    mem_frac = s.mem_used / total if s.mem_used is not None and total else None
    pfrac = s.power_w / limit if s.power_w is not None and limit else None
    tfrac = s.temp_c / slowdown if s.temp_c is not None else None
    tot = _n(total / GiB if total else None)
    if wide:
        cols = [(f"{_n(s.util):>3} %", 0), (f" SM{_n(s.sm_active):>3} %" if sm else "", 1),
                (f" {_n(used, '{:.1f}'):>5}/{tot:>3} GiB", 2), (f" {_n(s.power_w):>4} W", 3),
                (f" {_n(s.temp_c):>3} °C", 4)]
    else:
        cols = [(f"{_n(s.util):>3}%", 0), (f" SM{_n(s.sm_active):>3}%" if sm else "", 1),
                (f" {_n(used, '{:.1f}'):>4}/{tot}G", 2), (f" {_n(s.power_w):>3}W", 3),
                (f" {_n(s.temp_c):>2}°C", 4)]
    styles = ["green" if (s.util or 0) >= 50 else "yellow", "",
              level_style(mem_frac, 0.85, 0.95).replace("green", ""),
              "bold cyan" if pfrac is not None and pfrac >= 0.95 else "cyan", level_style(tfrac, 0.9, 0.97)]
    out = Line(f"GPU {_row_name(v):<{idx_w}} ", "bold")
    if sw:
        out.extend(spark(v.util, 0, 100, sw, "green"))
        out.append(" ")
    for text, k in cols:
        out.append(text, styles[k])
    mark = alert_mark(v.alert_level, v.alert_title) if marks else None
    badges = Line()
    for b in v.badges if marks else ():
        badges.append(f" [{b}]", "bold yellow" if b != "PWR CAP" else "dim cyan")
    if mark:
        out.append("  ")
        room = None if width is None else width - out.cell_len
        if room is not None and mark.cell_len + badges.cell_len > room:
            badges = Line()  # the title first: the badges say it again, the full panel shows them
            mark = cut_mark(mark, room)
        out.extend(mark)
    out.extend(badges)
    who = owners_brief(v) if marks and not mark else ""
    if who:  # the alert's title first: the owner only where none is shown (a cut line keeps what is left)
        out.append(f"  {who}", "dim")
    return out


def header(sw: int, sm: bool, label_w: int) -> Line:
    label = " " * label_w + "utilization" if sw >= 12 else ""
    return Line(f"{label:<{label_w + sw + (1 if sw else 0)}}{'util':>5}" + (" " * 8 if sm else "")
                + f"{'memory':>13}{'power':>6}{'temp':>6}  alert", "bold dim")


class GpuTable(TextLines):
    """One row per GPU (a page of them when even that does not fit), with a "+N more" line."""

    def __init__(self, **kw) -> None:
        super().__init__(id="gpu-table", **kw)
        self.rows: list[GpuView] = []
        self.more = 0
        self.page_key = "n"
        self.wide = False
        self.total = 0
        self._title = ""

    def show(self, rows: list[GpuView], total: int, more: int, wide: bool) -> None:
        self.rows, self.total, self.more, self.wide = rows, total, more, wide
        title = f"GPUs ({total})"
        if title != self._title:  # setting it, even unchanged, repaints the whole table
            self._title = self.border_title = title
        self.redraw()

    def text_lines(self, width: int) -> list[Line]:
        sm = any(v.sample.sm_active is not None for v in self.rows)
        idx_w = max((len(_row_name(v)) for v in self.rows), default=1)
        label_w = 4 + idx_w + 1  # "GPU 12 "
        # warnings and worse make room for their titles; information takes what is left
        mark_w = max((2 + alert_mark(v.alert_level, v.alert_title).cell_len for v in self.rows
                      if v.alert_level >= 2), default=0)
        # whose the busiest process is takes room too, up to OWNER_W (and the badges beside it)
        owner_w = max((2 + min(OWNER_W, len(who)) + sum(len(b) + 3 for b in v.badges) for v in self.rows
                       if (who := owners_brief(v))), default=0)
        mark_w = max(mark_w, owner_w)
        numbers_w = max((gpu_row(v, 0, sm, self.wide, idx_w, marks=False).cell_len for v in self.rows), default=0)
        sw = spark_width(width, self.wide, numbers_w, mark_w)
        lines = [gpu_row(v, sw, sm, self.wide, idx_w, width) for v in self.rows]
        if self.wide and lines:
            lines.insert(0, header(sw, sm, label_w))
        if self.more:
            lines.append(Line(f"+{self.more} more GPUs · {self.page_key}: next page", "bold yellow"))
        return [line.truncate(width) for line in lines]

    def render(self) -> Text:
        """The table as one Text (tests and tools)."""
        return join_lines(self.text_lines(self.content_size.width or self.size.width or 80))
