"""The host: per-core CPU, iowait, RAM, swap, disk and network rates."""

from __future__ import annotations

from rich.text import Text
from traintop.widgets.line import Line
from traintop.widgets.lines import TextLines, fit, join_lines

from traintop.units import fmt_bytes, fmt_rate
from traintop.reports.view import HostView
from traintop.widgets.render import bar, level_style, spark


class HostPanel(TextLines):
    def __init__(self, **kw) -> None:
        super().__init__(id="host", **kw)
        self.view: HostView | None = None
        self.compact = False
        self.border_title = "Host"

    def show(self, view: HostView, compact: bool) -> None:
        self.view, self.compact = view, compact
        self.redraw()

    def text_lines(self, width: int) -> list[Line]:
        h = self.view.sample if self.view else None
        if h is None:
            return fit(Line("no host data", "dim"), width, self.app.console, wrap=True)
        ram_frac = h.mem_used / h.mem_total if h.mem_used is not None and h.mem_total else None
        if self.compact:
            out = Line("CPU ", "bold")
            out.append(f"{h.cpu_percent or 0:3.0f} %", level_style((h.cpu_percent or 0) / 100, 0.85, 0.95))
            # In cores' worth, not cores at >= 90 %: one thread at 100 % that the scheduler moves
            # between cores leaves none of them busy, and an alert calling it CPU-bound would
            # then contradict "0 cores busy".
            n = len(h.per_core)
            used = (h.cpu_percent or 0) / 100 * n
            out.append(f" ({used:.1f} of {n} cores)  iowait {h.iowait or 0:.0f} %", "dim")
            out.append("  RAM ", "bold")
            out.append(f"{fmt_bytes(h.mem_used)}/{fmt_bytes(h.mem_total)}", level_style(ram_frac))
            if h.swap_used:
                out.append(f"  swap {fmt_bytes(h.swap_used)}", "yellow")
            out.append(f"  disk ↓{fmt_rate(h.disk_read)}", "dim")
            return [out.truncate(width)]
        cpu = Line("CPU  ", "bold").extend(spark(self.view.cpu, 0, 100, max(4, width - 12), "green"))
        cpu.append(f" {h.cpu_percent or 0:4.0f} %")
        cores = Line("cores ", "bold")  # one cell per core, 8 levels
        for c in h.per_core:
            cores.append("▁▂▃▄▅▆▇█"[min(7, int(c / 100 * 7 + 0.5))], level_style(c / 100, 0.85, 0.95))
        cores.append(f"  iowait {h.iowait or 0:.0f} %", "dim")
        ram = Line("RAM  ", "bold").extend(bar(ram_frac, max(4, width - 26), level_style(ram_frac)))
        ram.append(f" {fmt_bytes(h.mem_used)}/{fmt_bytes(h.mem_total)}")
        swap = f"swap {fmt_bytes(h.swap_used)}" if h.swap_total else "no swap"
        io = Line(f"{swap}  disk ↓{fmt_rate(h.disk_read)} ↑{fmt_rate(h.disk_write)}"
                  f"  net ↓{fmt_rate(h.net_rx)} ↑{fmt_rate(h.net_tx)}", "dim")
        return [line.truncate(width) for line in (cpu, cores, ram, io)]

    def render(self) -> Text:
        """The panel as one Text (tests and tools)."""
        return join_lines(self.text_lines(self.content_size.width or self.size.width))
