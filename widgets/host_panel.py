"""The host: per-core CPU, iowait, RAM, swap, disk and network rates."""

from __future__ import annotations

from rich.text import Text
from traintop.widgets.lines import TextLines

from traintop.units import fmt_bytes, fmt_rate
from traintop.view import HostView
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

    def render(self) -> Text:
        h = self.view.sample if self.view else None
        if h is None:
            return Text("no host data", style="dim")
        width = self.content_size.width or self.size.width
        ram_frac = h.mem_used / h.mem_total if h.mem_used is not None and h.mem_total else None
        out = Text(no_wrap=True, overflow="ellipsis")
        if self.compact:
            out.append("CPU ", style="bold")
            out.append(f"{h.cpu_percent or 0:3.0f} %", style=level_style((h.cpu_percent or 0) / 100, 0.85, 0.95))
            busy = sum(1 for c in h.per_core if c >= 90)
            out.append(f" ({busy}/{len(h.per_core)} cores busy)  iowait {h.iowait or 0:.0f} %", style="dim")
            out.append("  RAM ", style="bold")
            out.append(f"{fmt_bytes(h.mem_used)}/{fmt_bytes(h.mem_total)}", style=level_style(ram_frac))
            if h.swap_used:
                out.append(f"  swap {fmt_bytes(h.swap_used)}", style="yellow")
            out.append(f"  disk ↓{fmt_rate(h.disk_read)}", style="dim")
            return out
        out.append("CPU  ", style="bold")
        out.append_text(spark(self.view.cpu, 0, 100, max(4, width - 12), "green"))
        out.append(f" {h.cpu_percent or 0:4.0f} %\n")
        # one cell per core, 8 levels, wrapping
        cores = Text()
        for c in h.per_core:
            cores.append("▁▂▃▄▅▆▇█"[min(7, int(c / 100 * 7 + 0.5))], style=level_style(c / 100, 0.85, 0.95))
        out.append("cores ", style="bold")
        out.append_text(cores)
        out.append(f"  iowait {h.iowait or 0:.0f} %\n", style="dim")
        out.append("RAM  ", style="bold")
        out.append_text(bar(ram_frac, max(4, width - 26), level_style(ram_frac)))
        out.append(f" {fmt_bytes(h.mem_used)}/{fmt_bytes(h.mem_total)}\n")
        swap = f"swap {fmt_bytes(h.swap_used)}" if h.swap_total else "no swap"
        out.append(f"{swap}  disk ↓{fmt_rate(h.disk_read)} ↑{fmt_rate(h.disk_write)}"
                   f"  net ↓{fmt_rate(h.net_rx)} ↑{fmt_rate(h.net_tx)}", style="dim")
        return out
