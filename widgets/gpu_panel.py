"""One GPU: fixed-scale sparklines for utilization, power vs limit, memory and temperature."""

from __future__ import annotations

from rich.text import Text
from traintop.widgets.line import Line
from traintop.widgets.lines import TextLines, fit, join_lines

from traintop.text import one_line
from traintop.units import GiB, fmt_rate
from traintop.reports.view import GpuView
from traintop.widgets.gpu_table import alert_mark, owners_brief
from traintop.widgets.owner_text import proc_text
from traintop.widgets.render import level_style, spark

LEVEL_WORD = {1: "info", 2: "alert", 3: "critical"}
OWNER_MIN = 26  # the footer keeps at least this much of "PID 4242 alice · slurm …"


def _num(v, fmt: str = "{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


class GpuPanel(TextLines):
    def __init__(self, index: int, **kw) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-panel", **kw)
        self.index = index
        self.view: GpuView | None = None
        self.compact = False
        self._titles: tuple[str, str] | None = None

    def show(self, view: GpuView, compact: bool) -> None:
        self.view = view
        self.compact = compact
        info = view.info
        # Text, never markup: the name comes from the driver or a file.
        title = f"{one_line(info.label, 80)} · {one_line(info.name, 200)}"
        subtitle = " ".join(f"[{b}]" for b in view.badges)
        if (title, subtitle) != self._titles:
            self._titles = (title, subtitle)
            self.border_title = Text(title)
            self.border_subtitle = Text(subtitle)
        self.set_class(view.alert_level == 2, "-warning")
        self.set_class(view.alert_level >= 3, "-critical")
        self.redraw()

    # -- metric rows ---------------------------------------------------------
    def _rows(self) -> list[tuple[str, list, float, float, str, str]]:
        v = self.view
        s = v.sample
        # the scales fall back to what was seen; the figures say only what the source knows
        known_limit = s.power_limit_w or v.info.power_limit_w
        known_total = s.mem_total or v.info.mem_total
        known_slowdown = s.temp_slowdown_c or v.info.temp_slowdown_c
        limit = known_limit or max([p for p in v.power if p] or [1.0])
        total = known_total or max([m for m in v.mem if m] or [1.0])
        slowdown = known_slowdown or 90.0
        mem_frac = (s.mem_used / total) if s.mem_used is not None and total else None
        temp_frac = (s.temp_c / slowdown) if s.temp_c is not None else None
        if s.parent is not None:  # a MIG device: SM activity is its utilization; power and heat are its GPU's
            whose = f"on GPU {s.parent}"
            return [
                ("SM", v.util, 0.0, 100.0, "green" if (s.sm_active or 0) >= 50 else "yellow", f"{_num(s.sm_active)} %"),
                ("pwr", [], 0.0, 1.0, "cyan", whose),
                ("mem", v.mem, 0.0, total, level_style(mem_frac, 0.85, 0.95).replace("green", "magenta"),
                 f"{_num(s.mem_used / GiB if s.mem_used is not None else None, '{:.1f}')}/"
                 f"{_num(known_total / GiB if known_total else None, '{:.0f}')} GiB"),
                ("temp", [], 0.0, 1.0, "", whose),
            ]
        in_mig = s.util is None and v.info.mig  # a GPU in MIG mode: utilization is its MIG devices'
        return [
            ("util", v.util, 0.0, 100.0, "green" if (s.util or 0) >= 50 else "yellow",
             "MIG mode" if in_mig else
             f"{_num(s.util)} %" + (f" SM {s.sm_active:.0f}%" if s.sm_active is not None else "")),
            ("pwr", v.power, 0.0, limit, "cyan",
             f"{_num(s.power_w)}/{_num(known_limit)} W"),
            ("mem", v.mem, 0.0, total, level_style(mem_frac, 0.85, 0.95).replace("green", "magenta"),
             f"{_num(s.mem_used / GiB if s.mem_used is not None else None, '{:.1f}')}/"
             f"{_num(known_total / GiB if known_total else None, '{:.0f}')} GiB"),
            ("temp", v.temp, 20.0, slowdown + 3, level_style(temp_frac, 0.9, 0.97),
             f"{_num(s.temp_c)}" + (f"/{known_slowdown:.0f}" if known_slowdown else "") + " °C"),
        ]

    def _footer(self, width: int = 1 << 30) -> Line:
        """Clocks, GPM, PCIe and processes in one row; where they do not fit ``width``, the
        least telling go first (memory clock, process count, tensor and DRAM), never the PCIe
        figure a finding may be about."""
        s = self.view.sample
        n = len(s.processes)
        parts = [  # (keep rank: higher stays longer, text, style), in the order shown
            (5, f"SM {_num(s.sm_clock)}/{_num(s.sm_clock_max)} MHz", "bold" if s.sm_clock and s.sm_clock_max
             and s.sm_clock < 0.9 * s.sm_clock_max and (s.util or 0) > 50 else ""),
            (1, f"  mem {_num(s.mem_clock)} MHz", "dim"),
        ] if s.parent is None else [(5, f"MIG device of GPU {s.parent}", "dim")]
        if s.sm_active is not None:  # GPM: what the SMs did, not just "a kernel ran"
            parts.append((3, f"  tensor {_num(s.tensor_active)}% DRAM {_num(s.dram_active)}%", "dim"))
        if s.pcie_tx is not None or s.pcie_rx is not None:
            parts.append((4, f"  PCIe ↑{fmt_rate(s.pcie_tx)} ↓{fmt_rate(s.pcie_rx)}", "dim"))
        if s.nvlink_tx or s.nvlink_rx or (self.view.info.nvlinks and (s.nvlink_tx is not None or s.nvlink_rx is not None)):
            parts.append((4, f"  NVLink ↑{fmt_rate(s.nvlink_tx)} ↓{fmt_rate(s.nvlink_rx)}", "dim"))
        procs = self.view.procs
        elastic = None  # the owner's part: cut to what is left rather than dropped
        if n == 0 and self.view.info.mig and s.parent is None:
            parts.append((2, "  procs on its MIG devices", "dim"))
        elif procs and procs[0].owner is not None:
            more = f" +{n - 1} more" if n > 1 else ""
            elastic = (3.5, f"  {proc_text(procs[0])}{more}", "")
            parts.append(elastic)
        else:
            parts.append((2, f"  {n} proc{'s' if n != 1 else ''}{_busiest(s.processes)}", "dim"))

        def need(part) -> int:
            return min(len(part[1]), OWNER_MIN) if part is elastic else len(part[1])
        while len(parts) > 1 and sum(need(p) for p in parts) > width:
            parts.remove(min(parts, key=lambda p: p[0]))
        t = Line()
        for _, text, style in parts:
            t.append(text, style)
        return t

    def text_lines(self, width: int) -> list[Line]:
        if self.view is None:
            return fit(Line("waiting for the first sample…", "dim"), width, self.app.console, wrap=True)
        if self.compact:
            return [line.truncate(width) for line in self._compact_lines(width)]
        label_w, value_w = 5, 16
        sw = max(4, width - label_w - value_w - 1)
        out = []
        for label, series, lo, hi, style, value in self._rows():
            line = Line(f"{label:<{label_w}}", "bold").extend(spark(series, lo, hi, sw, style))
            out.append(line.append(f" {value:>{value_w}}").truncate(width))
        out.append(self._footer(width).truncate(width))
        return out

    def render(self) -> Text:
        """The panel as one Text (tests and tools)."""
        return join_lines(self.text_lines(self.content_size.width or self.size.width))

    def _compact_lines(self, width: int) -> list[Line]:
        v, s = self.view, self.view.sample
        out = Line()
        out.append(f"{one_line(v.info.label, 80)} ", "bold")
        if v.info.parent is None:  # a MIG device's label already says its profile
            out.append(one_line(v.info.name.replace("NVIDIA ", ""), 200), "bold")
        for b in v.badges:
            out.append(f" [{b}]", "bold yellow" if b != "PWR CAP" else "cyan")
        if v.alert_level:  # ✖ critical, ▲ warning, ℹ information: only warnings and worse are "alerts"
            out.append("  ")
            out.extend(alert_mark(v.alert_level, LEVEL_WORD.get(v.alert_level)))
        if s.parent is None:
            out.append(f"  SM {_num(s.sm_clock)} MHz", "dim")
        who = owners_brief(v)
        if who:
            out.append(f"  {who}")
        lines = [out]
        rows = self._rows()
        half = max(20, width // 2)
        for pair in (rows[0:2], rows[2:4]):
            line = Line()
            for j, (label, series, lo, hi, style, value) in enumerate(pair):
                col_w = half if j == 0 else width - half
                sw = max(3, col_w - 5 - len(value) - 2)
                line.append(f"{label[:4]:<5}", "bold")
                line.extend(spark(series, lo, hi, sw, style))
                line.append(f" {value}" + (" " if j == 0 else ""))
            lines.append(line)
        return lines


def _busiest(processes) -> str:
    """Where NVML gives a process's share of the GPU and two or more share it: the busiest one's."""
    shared = [p for p in processes if p.sm_util is not None]
    if not shared or len(processes) < 2:
        return ""
    top = max(shared, key=lambda p: p.sm_util)
    return f", PID {top.pid} busiest at {top.sm_util:.0f} %"
