"""The cluster dashboard's panels: one compact line per GPU grouped by host, one per rank,
and the cluster's findings. Display only: they draw a ClusterSnapshot they are handed."""

from __future__ import annotations

import math
import time

from rich.text import Text

from traintop.cluster.groups import group_lines
from traintop.cluster.snapshot import ClusterSnapshot
from traintop.rules import Severity
from traintop.text import one_line
from traintop.units import GiB, fmt_duration
from traintop.widgets.alerts_panel import subject_label
from traintop.widgets.lines import TextLines
from traintop.widgets.wrap import keep_units
from traintop.widgets.render import SEVERITY_ICON, SEVERITY_STYLE, bar, level_style, spark


def _vals(xs):
    return [None if (x is None or (isinstance(x, float) and math.isnan(x))) else x for x in xs]


def _pct(v):
    return "  –" if v is None else f"{v * 100:3.0f}"


GPU_LINES_UP_TO = 64  # GPUs shown one line each; above, one line per host (a focused host: its GPUs)
RANK_LINES_UP_TO = 64  # ranks of a job shown one line each; above, the slowest
SLOWEST_SHOWN = 12


class HostsBody(TextLines):
    """GPUs grouped by host (``focus``: one host only), then the ranks of each job. A cluster
    larger than a screen shows a line per host and each job's slowest ranks: nobody reads
    a thousand lines, and drawing them would hold the screen up at every refresh."""

    snapshot: ClusterSnapshot | None = None
    focus_host: str | None = None
    focus_job: str | None = None
    grouping: str = "host"  # or "job", "user" (traintop.cluster.groups)
    _text: Text | None = None
    _text_width = -1

    def show(self, snap: ClusterSnapshot | None, focus_host: str | None, focus_job: str | None,
             grouping: str = "host") -> None:
        self.snapshot, self.focus_host, self.focus_job, self.grouping = snap, focus_host, focus_job, grouping
        self._text = None
        lines = self._line_count()
        if lines != self.styles.height:
            self.styles.height = lines
        self.refresh()

    def on_resize(self, event) -> None:
        self._text = None

    def _line_count(self) -> int:
        return max(1, len(self.render().plain.split("\n")))

    def render(self) -> Text:
        if self._text is None or self._text_width != self.content_size.width:
            self._text_width = self.content_size.width
            self._text = self._render()
        return self._text.copy()

    def _render(self) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        s = self.snapshot
        if s is None:
            out.append("Reading Prometheus…", style="dim")
            return out
        width = max(40, self.content_size.width or 80)
        spark_w = max(0, min(30, width - 50))
        jobs = {r.job for r in s.ranks}
        hosts = [h for h in s.hosts if self.focus_host in (None, h)]
        if self.focus_job is not None:
            hosts = [h for h in hosts if any(r.host == h and r.job == self.focus_job for r in s.ranks)]
        findings: dict[str, int] = {}
        for f in s.findings:
            if f.severity > Severity.INFO:
                findings[f.host] = findings.get(f.host, 0) + 1
        if self.grouping != "host":
            _group_rows(out, s, self.grouping, set(hosts), width)
        elif self.focus_host is None and len(s.gpus) > GPU_LINES_UP_TO and s.host_lines:
            self._host_rows(out, s, set(hosts), findings, spark_w)
        else:
            self._gpu_rows(out, s, hosts, findings, spark_w)
        ranks = [r for r in s.ranks if (self.focus_job in (None, r.job)) and (self.focus_host in (None, r.host))]
        for job in sorted(jobs):
            rs = [r for r in ranks if r.job == job]
            if not rs:
                continue
            out.append("\n\n")
            out.append(f"job {one_line(job, 40)}", style="bold")
            out.append(f"  {len(rs)} of {rs[0].world_size} ranks · step time · input wait", style="dim")
            top = max((r.step for r in rs if r.step), default=0.0) or 1.0
            if len(rs) > RANK_LINES_UP_TO:
                out.append(f" · the {SLOWEST_SHOWN} slowest (h: a host's)", style="dim")
                rs = sorted(rs, key=lambda r: (-(r.step or 0.0), -(r.wait or 0.0), r.rank))[:SLOWEST_SHOWN]
            for r in rs:
                out.append("\n")
                start = len(out)
                out.append(f" r{r.rank:<4}", style="bold")
                out.append(f"{one_line(r.host, 14):<14} ", style="dim")
                out.append(f"{r.step:6.3f}s " if r.step is not None else "     –s ")
                wait_style = "bold yellow" if (r.wait or 0) >= 0.2 else "dim"
                out.append(f"wait {_pct(r.wait)}% ", style=wait_style)
                if spark_w:
                    out.append_text(spark(_vals(r.spark)[-spark_w:], 0.0, top * 1.1, spark_w, style="cyan").to_text())
                if s.silent_for(r.host) is not None:  # its host stopped reporting: the last numbers, not now's
                    out.stylize("dim", start, len(out))
        return out

    @staticmethod
    def _gpu_rows(out: Text, s: ClusterSnapshot, hosts: list[str], findings: dict, spark_w: int) -> None:
        first = True
        for h in hosts:
            gpus = [g for g in s.gpus if g.host == h]
            if not first:
                out.append("\n")
            first = False
            n_find = findings.get(h, 0)
            out.append(one_line(h, 40), style="bold")
            out.append(f"  {len(gpus)} GPU" + ("s" if len(gpus) != 1 else ""), style="dim")
            if n_find:
                out.append(f"  ▲ {n_find}", style="bold yellow")
            silent = s.silent_for(h)
            if silent is not None:
                out.append(f"  no data for {fmt_duration(silent)}: its last numbers", style="bold yellow")
            if h in s.unreadable:
                out.append("  GPUs unreadable: its agent cannot read them (NVML)", style="bold red")
            for g in gpus:
                out.append("\n")
                start = len(out)
                style = level_style(g.util, warn=2.0, crit=2.0) if g.util is not None else "bright_black"
                out.append(f" {g.index:>2} ", style="bold")
                out.append_text(bar(g.util, 8, style="green" if (g.util or 0) >= 0.5 else "yellow").to_text())
                out.append(f" {_pct(g.util)}% ", style=style)
                if spark_w:
                    out.append_text(spark(_vals(g.spark)[-spark_w:], 0.0, 1.0, spark_w).to_text())
                    out.append(" ")
                out.append(f"{g.power:4.0f}W" if g.power is not None else "   –W", style="dim")
                if g.mem_used is not None:
                    out.append(f" {g.mem_used / GiB:5.1f}G", style="dim")
                if g.temp is not None:
                    out.append(f" {g.temp:3.0f}°", style="yellow" if g.temp >= 83 else "dim")
                if g.clock_ratio is not None and g.clock_ratio < 0.85:
                    out.append(f" clk {g.clock_ratio * 100:.0f}%", style="yellow")
                if silent is not None:
                    out.stylize("dim", start, len(out))

    @staticmethod
    def _host_rows(out: Text, s: ClusterSnapshot, shown: set, findings: dict, spark_w: int) -> None:
        rows = [h for h in s.host_lines if h.host in shown]
        out.append(f"{len(rows)} hosts · {sum(h.gpus for h in rows)} GPUs · mean utilization · power · "
                   "hottest · h: a host's GPUs", style="dim")
        for h in rows:
            out.append("\n")
            start = len(out)
            out.append(f"{one_line(h.host, 14):<14} ", style="bold")
            out.append_text(bar(h.util, 8, style="green" if (h.util or 0) >= 0.5 else "yellow").to_text())
            out.append(f" {_pct(h.util)}% ")
            if spark_w:
                out.append_text(spark(_vals(h.spark)[-spark_w:], 0.0, 1.0, spark_w).to_text())
                out.append(" ")
            out.append(f"{h.power / 1000:5.1f}kW" if h.power is not None else "    –kW", style="dim")
            if h.temp is not None:
                out.append(f" {h.temp:3.0f}°", style="yellow" if h.temp >= 83 else "dim")
            if h.util_min is not None and h.util is not None and h.util_min < 0.5 <= h.util:
                out.append(f" min {_pct(h.util_min).strip()}%", style="yellow")
            if h.clock_ratio is not None and h.clock_ratio < 0.85:
                out.append(f" clk {h.clock_ratio * 100:.0f}%", style="yellow")
            if findings.get(h.host):
                out.append(f"  ▲ {findings[h.host]}", style="bold yellow")
            silent = s.silent_for(h.host)
            if silent is not None:
                out.stylize("dim", start, len(out))
                out.append(f" no data for {fmt_duration(silent)}", style="bold yellow")
            if h.host in s.unreadable:
                out.append(" GPUs unreadable", style="bold red")


NEXT_GROUPING = {"host": "job", "job": "user", "user": "host"}
UNNAMED = {"job": "(no job)", "user": "(unknown user)"}


def _group_rows(out: Text, s: ClusterSnapshot, by: str, hosts: set, width: int) -> None:
    """One line per job or user: the GPUs its processes hold now, their mean utilization, the memory
    they hold, and the GPU-hours they held idle over the window shown."""
    out.append(f"by {by} · GPUs · utilization · memory · GPU-hours held idle ({fmt_duration(s.window_s)}) · "
               f"u: by {NEXT_GROUPING[by]}", style="dim")
    if not s.held:
        out.append("\nNo owner series here: live traintop agents export whose processes hold each GPU "
                   "(a simulated agent's processes are made up, and dcgm-exporter alone has none).", style="yellow")
        return
    util = {(g.host, g.index): g.util for g in s.gpus}
    rows = group_lines(s.held, util, by, hosts)
    goodput = dict(s.goodput)
    name_w = max(12, min(32, width - 56, max((len(r.name) for r in rows), default=0)))
    for r in rows:
        out.append("\n")
        name = one_line(r.name, name_w) if r.name else UNNAMED[by]
        out.append(f"{name:<{name_w}} ", style="bold" if r.name else "dim")
        out.append(f"{r.gpus:>3} GPU{'s' if r.gpus != 1 else ' '}", style="bold")
        out.append(f" on {r.hosts:>2} host{'s' if r.hosts != 1 else ' '} ", style="dim")
        out.append_text(bar(r.util, 8, style="green" if (r.util or 0) >= 0.5 else "yellow").to_text())
        out.append(f" {_pct(r.util)}% ")
        out.append(f"{r.mem_held / GiB:6.1f}G held", style="dim")
        out.append(f"  idle {r.idle_hours:.2f} GPU-h", style="bold yellow" if r.idle_hours >= 0.01 else "dim")
        if by == "job" and r.name in goodput:  # its ranks' time ledgers (the probe)
            g = goodput[r.name]
            out.append(f"  goodput {g * 100:.0f}%", style="bold green" if g >= 0.9 else "bold yellow")
    held_now = {(h.host, h.gpu) for h in s.held if h.bytes_now}
    free = [g for g in s.gpus if g.host in hosts and (g.host, g.index) not in held_now]
    if free:
        out.append(f"\n{len(free)} GPU{'s' if len(free) != 1 else ''} held by no process", style="dim")


def finding_paragraphs(s: ClusterSnapshot | None, focus_host: str | None, compact: bool,
                       hosts: set[str] | None = None) -> list:
    """The cluster's findings as (line, hanging indent) paragraphs, like the local alerts.
    ``hosts``: only those of these hosts (the hosts of the job in focus)."""
    out = []
    if s is None:
        return out
    fs = [f for f in s.findings if focus_host in (None, f.host) and (hosts is None or f.host in hosts)]
    fs.sort(key=lambda f: (-int(f.severity), f.scope != "cluster", f.host, f.rule))
    if not fs:
        line = Text("✔ No problems detected", style="bold green")
        line.append(" across the hosts shown.", style="dim")
        out.append((line, 2))
    for k, f in enumerate(fs):
        if k:
            out.append((Text(), 0))
        sev = int(f.severity)
        head = Text(f"{SEVERITY_ICON.get(sev, '•')} {one_line(f.title, 200)}", style=SEVERITY_STYLE.get(sev, ""))
        if f.scope == "cluster":
            where = f.host if f.subject == f.host else f"{f.host} · {f.subject}"
        else:
            where = f"{f.host} · {subject_label(f.subject)}"
        head.append(keep_units(f" · {one_line(where, 80)} · {fmt_duration(round(f.end - f.start, 1))}"), style="dim")
        out.append((head, 2))
        out.append((Text("  " + keep_units(one_line(f.evidence, 2000))), 2))
        for rem in f.remedies[: 1 if compact or k else 3]:
            line = Text("  → ", style="bold cyan")
            line.append(keep_units(one_line(rem, 2000)))
            out.append((line, 4))
    return out


def status_line(s: ClusterSnapshot | None, url: str, job: str | None, focus_host: str | None, paused: bool,
                problem: str | None, stale: float | None = None, grouping: str = "host") -> Text:
    """``stale``: seconds since the last good read, when that is more than two refreshes."""
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append(" CLUSTER ", style="bold black on cyan")
    if s is not None and stale is not None:
        out.append(f" STALE: data of {time.strftime('%H:%M:%S', time.localtime(s.t))}, no read for {stale:.0f} s ",
                   style="bold white on red")
    elif s is not None:
        out.append(" " + time.strftime("%H:%M:%S", time.localtime(s.t)), style="bold")
    # what the user set (pause, focus) first: at 80 columns the line is cut from the right
    if paused:
        out.append("  ‖ PAUSED", style="bold yellow")
    if focus_host:
        out.append(f"  host {one_line(focus_host, 40)}", style="bold cyan")
    if job:
        out.append(f"  job {one_line(job, 40)}", style="bold cyan")
    if grouping != "host":
        out.append(f"  by {grouping}", style="bold cyan")
    if s is not None:
        silent = {h for h, _ in s.silent}

        def count(n: int, what: str, quiet: int) -> str:
            return f"{n} {what if n != 1 else what[:-1]}" + (f" ({quiet} without data)" if quiet else "")

        out.append("  " + " · ".join((
            count(len(s.hosts), "hosts", len(silent)),
            count(len(s.gpus), "GPUs", sum(g.host in silent for g in s.gpus)),
            count(len(s.ranks), "ranks", sum(r.host in silent for r in s.ranks)))), style="bold")
    if s is not None and s.unreadable:
        n = len(s.unreadable)
        out.append(f"  GPUs unreadable on {n} host{'s' if n != 1 else ''}", style="bold red")
    if problem:
        out.append("  ⚠ " + one_line(problem, 160), style="bold red")
    out.append(f"  {one_line(url, 80)}", style="dim")
    if s is not None and s.kind == "dcgm":
        out.append("  (dcgm-exporter only)", style="yellow")
    return out
