"""The attached training process: its tree, loader workers, and GPU memory NVML attributes to it."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widget import Widget

from traintop.units import fmt_bytes, fmt_rate
from traintop.view import ProcessView
from traintop.widgets.render import level_style


class ProcessPanel(Widget):
    def __init__(self, **kw) -> None:
        super().__init__(id="process", **kw)
        self.view: ProcessView | None = None
        self.compact = False
        self.border_title = "Process"

    def show(self, view: ProcessView, compact: bool) -> None:
        self.view, self.compact = view, compact
        p = view.sample
        self.border_title = f"Process {p.pid} · {p.name}" if p else "Process"
        self.refresh()

    def render(self) -> Text:
        v = self.view
        p = v.sample if v else None
        out = Text(no_wrap=True, overflow="ellipsis")
        if p is None:
            out.append("No process attached. ", style="dim")
            out.append("traintop --pid N", style="bold")
            out.append(" attaches to a running job.", style="dim")
            return out
        if not p.alive:
            when = time.strftime("%H:%M:%S", time.localtime(v.ended_at)) if v.ended_at else "recently"
            out.append(f"PID {p.pid} ({p.name}) ended at {when}; its history stays on screen.", style="bold yellow")
            return out
        workers = p.loader_workers
        gpu_mem = ", ".join(f"GPU {i} {fmt_bytes(b)}" for i, b in sorted(v.gpu_mem.items())) or "no GPU memory"
        if self.compact:
            out.append(f"PID {p.pid} ", style="bold")
            out.append(f"CPU {p.cpu_percent or 0:.0f} %  RSS {fmt_bytes(p.rss)}  {gpu_mem}", style="")
            if workers:
                busy = sum(1 for w in workers if (w.cpu_percent or 0) >= 85)
                out.append(f"  workers {len(workers)} ({busy} at 100 %)",
                           style="bold yellow" if busy else "dim")
            return out
        out.append(p.cmdline[: max(10, (self.content_size.width or 60))] + "\n", style="dim")
        out.append(f"CPU {p.cpu_percent or 0:.0f} %  RSS {fmt_bytes(p.rss)}  threads {p.threads or 0}"
                   f"  I/O ↓{fmt_rate(p.read_rate)} ↑{fmt_rate(p.write_rate)}\n")
        out.append("GPU memory (NVML, an upper bound): ", style="dim")
        out.append(gpu_mem + "\n")
        if workers:
            out.append(f"loader workers ({len(workers)}): ", style="bold")
            for w in workers[:12]:
                c = w.cpu_percent or 0
                out.append(f"{c:.0f}% ", style=level_style(c / 100, 0.85, 0.95))
        else:
            out.append("no data-loader workers seen", style="dim")
        return out
