"""The attached training process: its tree, loader workers, and GPU memory NVML attributes to it."""

from __future__ import annotations

import time

from rich.text import Text
from traintop.widgets.line import Line
from traintop.widgets.lines import TextLines, fit, fit_parts, join_lines

from traintop.rules.config import DEFAULT, Thresholds
from traintop.text import one_line
from traintop.units import fmt_bytes, fmt_duration, fmt_rate
from traintop.record.evidence import short
from traintop.samples import LEDGER_BUCKETS
from traintop.reports.view import LEDGER_WINDOW_S, ProcessView, RankView
from traintop.widgets.memory_chart import memory_chart, rss_chart
from traintop.widgets.owner_text import owner_text, proc_text

# A chart costs about 1 ms (braille, widgets/memory_chart.py); drawn again only when memory
# moves it still costs less. It spans 240 samples (4 minutes at 1 s), so redrawn every 10 s it
# lags by at most 4 % of its width; the figures above it are live every frame.
CHART_EVERY_S = 10.0
CHART_IDLE_S = 30.0
CHART_STEP_BYTES = 64 * 2**20  # a move smaller than this does not redraw the chart
WORKERS_SHOWN = 12  # loader workers' CPU figures on the line; "… +N" says how many more
PROCESSES_SHOWN = 12  # rows of the job's processes where no GPU memory chart takes the room
from traintop.widgets.render import bar, level_style, spark
from traintop.widgets.wrap import keep_units

NO_PROBE = ("No probe in this job: NVML's per-process figure is an upper bound (reserved + CUDA context "
            "+ other allocations). For allocated vs reserved, step time and input wait, start it with "
            "`traintop run -- python train.py` or add `import traintop.probe`.")


NO_PROBE_YET = ("No probe message yet: the probe runs inside each Python process of the job (a shell or a "
                "program in another language has none).")


def rank_line(rv: RankView, thresholds: Thresholds = DEFAULT) -> Line:
    r = rv.sample
    where = f" · GPU {rv.gpu}" if rv.gpu is not None else ""
    out = Line(f"{one_line(r.label, 40)}{where}: ", "bold")
    if not r.cuda:
        out.append("no CUDA in this process", "yellow")
    else:
        gib = lambda b: "–" if b is None else f"{b / 2**30:.1f}"  # noqa: E731
        out.append(f"alloc {gib(r.allocated)}", "green")
        out.append(f" / res {gib(r.reserved)}", "yellow")
        if rv.nvml_used is not None:
            out.append(f" / NVML {gib(rv.nvml_used)}", "red")
        out.append("\u00a0GiB")
        if r.reserved and r.allocated is not None:
            frag = (r.reserved - r.allocated) / r.reserved
            out.append(f" · cached {frag * 100:.0f}\u00a0%", "dim")
        out.append(f" · peak {gib(r.peak)}" + ("\u00a0GiB" if r.peak is not None else ""), "dim")
        if r.alloc_retries:
            out.append(f"  retries {r.alloc_retries}", "bold yellow")
        if r.ooms:
            out.append(f"  OOM {r.ooms}", "bold red")
    if r.steps:
        out.append(f" · {steps_text(r)}")
        if r.step_time:
            out.append(f" ({r.step_time * 1000:.0f} ms)", "dim")
    if r.skipped_steps:
        out.append(f" · {skipped_text(r)}", skipped_style(r, thresholds))
    wait = rv.input_wait_10s if rv.input_wait_10s is not None else r.input_wait
    if r.loader is False:  # the input wait is measured in DataLoader iterators: none here
        out.append(" · no DataLoader seen", "dim")
    elif wait is not None:
        out.append(f" · input\u00a0wait\u00a0{wait * 100:.0f}\u00a0%",
                   "bold yellow" if wait >= thresholds.starvation_input_wait else "dim")
    if r.matmul_mode:
        out.append(f" · {r.matmul_mode}", "bold yellow" if r.matmul_mode == "fp32" else "dim")
    if rv.mfu is not None:
        out.append(f" · MFU\u00a0{rv.mfu * 100:.0f}\u00a0%")
    return out


NBSP = "\u00a0"
# The ledger's buckets as the panel names and draws them (train first: the goodput).
# Explicit colours: a theme maps the named ones (yellow, blue) to other hues than their names.
LEDGER_STYLE = {"train": ("train", "#5fd700"), "input": ("input", "#ffd700"), "collective": ("collective", "#ff8700"),
                "checkpoint": ("checkpoint", "#d700d7"), "eval": ("eval", "#00d7d7"), "compile": ("compile", "#5f87ff"),
                "startup": ("startup", "#5f87ff"), "stalled": ("stalled", "#d70000"), "other": ("other", "#a8a8a8")}


def ledger_line(rv: RankView, width: int) -> Line | None:
    """'time (5 min) ▕███▒▒░▏ goodput 74 % · checkpoint 21 % · input 3 % · other 2 %': where the
    rank's wall time went, train first, then the largest; None without a ledger."""
    shares = rv.ledger
    if not shares:
        return None
    out = Line("time ", "bold")
    bar = max(8, min(30, width // 5))
    cells, acc = 0, 0.0
    out.append("▕", "dim")
    for b in LEDGER_BUCKETS:
        v = shares.get(b, 0.0)
        if v <= 0:
            continue
        acc += v
        n = round(acc * bar) - cells
        if n > 0:
            out.append("█" * n, LEDGER_STYLE[b][1])
            cells += n
    out.append(" " * max(0, bar - cells) + "▏ ", "dim")
    goodput = shares.get("train", 0.0)
    out.append(f"goodput\u00a0{goodput * 100:.0f}\u00a0%", "bold green" if goodput >= 0.9 else "bold yellow")
    rest = sorted(((v, b) for b, v in shares.items() if b != "train" and v >= 0.005), reverse=True)
    for v, b in rest:
        out.append(f" · {LEDGER_STYLE[b][0]}\u00a0{v * 100:.0f}\u00a0%", LEDGER_STYLE[b][1])
    # the time it covers: its window, or less for a job younger than that
    covers = f"{LEDGER_WINDOW_S / 60:.0f} min" if rv.ledger_s is None or rv.ledger_s >= LEDGER_WINDOW_S - 0.5 \
        else fmt_duration(rv.ledger_s).removesuffix(" 00 s")  # "2 min", "4 min 13 s", "30 s"
    return out.append("  (" + f"{one_line(rv.sample.label, 20)}, {covers})".replace(" ", NBSP), "dim")


LEDGER_RANKS_SHOWN = 4  # a ledger line per rank up to this many ranks; beyond, the lowest goodput's


def ledger_ranks(ranks: list[RankView]) -> list[RankView]:
    """The ranks whose time ledger the panel shows: every one of a small job (one rank's checkpoint
    is another's wait at the barrier), else the one with the lowest goodput."""
    with_ledger = [rv for rv in ranks if rv.ledger]
    if len(with_ledger) <= LEDGER_RANKS_SHOWN:
        return with_ledger
    return [min(with_ledger, key=lambda rv: rv.ledger.get("train", 0.0))]


def compact_rank_line(rv: RankView, ranks: int, width: int, thresholds: Thresholds = DEFAULT) -> Line:
    """One line for a narrow pane: where the time goes first (goodput, MFU, input wait), then the
    rest; what does not fit is left out whole, least telling first."""
    r = rv.sample
    where = f" GPU {rv.gpu}" if rv.gpu is not None else ""
    head = Line(f"{one_line(r.label, 40)}{where}", "bold")
    if ranks > 1:
        head.append(f" (+{ranks - 1})", "dim")
    parts: list[Line] = []
    if rv.ledger:
        g = rv.ledger.get("train", 0.0)
        parts.append(Line(f"goodput {g * 100:.0f} %", "green" if g >= 0.9 else "bold yellow"))
    if rv.mfu is not None:
        parts.append(Line(f"MFU {rv.mfu * 100:.0f} %"))
    wait = rv.input_wait_10s if rv.input_wait_10s is not None else r.input_wait
    if r.loader is False:
        parts.append(Line("no DataLoader seen", "dim"))
    elif wait is not None:
        parts.append(Line(f"input wait {wait * 100:.0f} %",
                          "bold yellow" if wait >= thresholds.starvation_input_wait else ""))
    if r.steps:
        steps = Line(steps_text(r))
        if r.step_time:
            steps.append(f" ({r.step_time * 1000:.0f} ms)", "dim")
        parts.append(steps)
    if r.skipped_steps:
        parts.append(Line(skipped_text(r), skipped_style(r, thresholds)))
    if r.matmul_mode:
        parts.append(Line(r.matmul_mode, "bold yellow" if r.matmul_mode == "fp32" else "dim"))
    if not r.cuda:
        parts.append(Line("no CUDA in this process", "yellow"))
    else:
        gib = lambda b: "–" if b is None else f"{b / 2**30:.1f}"  # noqa: E731
        memory = Line(f"alloc {gib(r.allocated)}", "green").append(f" / res {gib(r.reserved)} GiB", "yellow")
        if r.ooms:
            memory.append(f"  OOM {r.ooms}", "bold red")
        elif r.alloc_retries:
            memory.append(f"  retries {r.alloc_retries}", "bold yellow")
        parts.append(memory)
    return fit_parts(head, parts, width)


def steps_text(r) -> str:
    """"12.1 steps/s", or "– steps/s" while the rate is not known yet (never a 0 it did not measure)."""
    return "– steps/s" if r.steps_per_s is None else f"{r.steps_per_s:.1f} steps/s"


def skipped_text(r) -> str:
    """The optimizer steps a GradScaler skipped since the job began: they count as steps (and as
    goodput) though they changed no weight."""
    return f"{r.skipped_steps}\u00a0skipped"


def skipped_style(r, thresholds: Thresholds = DEFAULT) -> str:
    # a few skips are how the scaler finds its scale; a large share (since the job began) is the overflow's
    return "bold red" if r.steps and r.skipped_steps >= thresholds.skipped_steps_min_frac * r.steps else "dim"


class ProcessPanel(TextLines):
    def __init__(self, **kw) -> None:
        super().__init__(id="process", **kw)
        self.view: ProcessView | None = None
        self.compact = False
        self.border_title = "Process"
        self._title = "Process"

    def show(self, view: ProcessView, compact: bool) -> None:
        self.view, self.compact = view, compact
        p = view.sample
        # Text, never markup: the name is whatever the process calls itself.
        title = f"Process {p.pid} · {one_line(p.name, 100)}" if p else "Process"
        if title != self._title:
            self._title = title
            self.border_title = Text(title)
        self.redraw()

    def text_lines(self, width: int) -> list[Text | Line]:
        body, rank = self._body(width)
        console, wrap = self.app.console, not self.compact
        lines = [row for line in body for row in fit(line, width, console, wrap)]  # wrapped: count the rows
        room = (self.content_size.height or 0) - len(lines) - 1
        if rank is not None and room >= 6:  # the chart's rows are never wider than the panel
            lines.extend(self._chart(rank, width, room))
        elif not self.compact and room >= 2 and self.view is not None and self.view.sample is not None:
            lines.extend(self._host_side(width, room))
        return lines

    def _host_side(self, width: int, room: int) -> list[Line]:
        """The rows no GPU memory chart takes (a job without CUDA, a host without a GPU): the job's
        processes, the busiest first (which loader worker or rank holds a core), then its resident
        memory over time (a leak on the host side: loader workers copying the dataset)."""
        v = self.view
        members = sorted(v.sample.members, key=lambda m: -(m.cpu_percent or 0))
        out: list[Line] = []
        if len(members) >= 2:
            rows = min(len(members), PROCESSES_SHOWN, room - 1)
            shown = members if rows == len(members) else members[: max(0, rows - 1)]
            head = Line(f"{len(members)} processes, the busiest first", "dim")
            if head.cell_len + 25 <= width:
                head.append(" (CPU: 100\u00a0% is one core)", "dim")
            out.append(head)
            out.extend(member_line(m, width) for m in shown)
            if len(shown) < len(members):
                out.append(Line(f"… +{len(members) - len(shown)} more", "dim"))
        left = room - len(out) - (1 if out else 0)
        if left >= 6 and sum(x is not None for x in v.rss) >= 2:
            out += [Line()] if out else []
            out += self._cached("rss", (width, left, v.sample.pid), (v.rss,), lambda: rss_chart(v.rss, width, left))
        return out

    def render(self) -> Text:
        """The whole panel as one Text (tests and tools)."""
        return join_lines(self.text_lines(self.content_size.width or 60))

    def _body(self, width: int) -> tuple[list[Line], RankView | None]:
        """The lines above the memory chart, and the rank whose chart goes below it (or None)."""
        v = self.view
        p = v.sample if v else None
        if p is None:
            if v is not None and not v.live:
                return [Line("No process was attached when this was recorded.", "dim")], None
            if v is not None and any(gp.owner is not None for gp in v.gpu_procs):
                return self._gpu_processes(v), None
            out = Line("No process attached. ", "dim").append("traintop --pid N", "bold")
            return [out.append(" attaches to a running job.", "dim")], None
        if v.job_end is not None:  # a job of `traintop run`: how it ended, as soon as it did
            end = v.job_end
            out = Line(end.describe(capital=True), "bold red" if end.status else "bold green")
            out.append(f" (PID {p.pid}, {one_line(p.name, 100)}); its history stays on screen. "
                       "q quits with its status.", "yellow")
            return self._cpu_history([out], v), None
        if not p.alive:
            when = time.strftime("%H:%M:%S", time.localtime(v.ended_at)) if v.ended_at else "recently"
            out = Line(f"PID {p.pid} ({one_line(p.name, 100)}) ended at {when}; its history stays on screen.",
                       "bold yellow")
            return self._cpu_history([out], v), None
        workers = p.loader_workers
        gpu_mem = ", ".join(f"GPU\u00a0{i}\u00a0{fmt_bytes(b)}"
                            + (f"\u00a0(busy\u00a0{v.gpu_share[i]:.0f}\u00a0%)" if i in v.gpu_share else "")
                            for i, b in sorted(v.gpu_mem.items())) or "no GPU memory"
        if self.compact and v.ranks:
            return [compact_rank_line(v.ranks[0], len(v.ranks), width, v.thresholds)], None
        if self.compact:
            out = Line(f"PID {p.pid} ", "bold").append(f"CPU {p.cpu_percent or 0:.0f} %")
            load = v.workers
            if load is not None and load.count:
                busy = f"{len(load.busy)} at {load.busy_mean:.0f} %" if load.busy else "none saturated"
                out.append(f"  workers {load.count} ({busy})", "bold yellow" if load.busy else "dim")
            out.append(f"  {gpu_mem}  RSS {fmt_bytes(p.rss)}")
            if v.owners:
                out.append(f"  {owner_text(v.owners[0])}", "dim")
            return [out], None
        lines = [Line(one_line(p.cmdline[: max(10, width)]), "dim")]
        if v.cpu and any(c is not None for c in v.cpu):  # the job's CPU over time (100 % = one core)
            top = max([100.0] + [c for c in v.cpu if c is not None])
            cpu = Line("CPU  ", "bold").extend(spark(v.cpu, 0, top, max(4, width - 14), "green"))
            lines.append(cpu.append(f" {p.cpu_percent or 0:5.0f}\u00a0%"))
        lines.append(Line(keep_units(f"CPU {p.cpu_percent or 0:.0f} %  RSS {fmt_bytes(p.rss)}  threads {p.threads or 0}"
                                     f"  I/O\u00a0↓{fmt_rate(p.read_rate)}\u00a0↑{fmt_rate(p.write_rate)}")))
        lines.append(Line("GPU memory (NVML, an upper bound): ", "dim").append(keep_units(gpu_mem)))
        if v.owners:
            lines.append(Line("whose: ", "dim").append("; ".join(owner_text(o) for o in v.owners)))
        if workers:
            line = Line(f"loader workers ({len(workers)}): ", "bold")
            for w in workers[:WORKERS_SHOWN]:
                c = w.cpu_percent or 0
                line.append(f"{c:.0f}% ", level_style(c / 100, 0.85, 0.95))
            if len(workers) > WORKERS_SHOWN:  # the count and the list agree
                line.append(f"… +{len(workers) - WORKERS_SHOWN}", "dim")
            lines.append(line)
        else:
            lines.append(Line("no data-loader workers seen", "dim"))
        if not v.ranks:
            if v.probe_silent_s is not None:  # it had the probe: not "no probe"
                lines.append(Line(f"Probe: no message for {fmt_duration(v.probe_silent_s)} (the job had the probe; "
                                  "idle, or it stopped reporting)", "dim"))
            else:
                lines.append(Line(NO_PROBE_YET if v.launched else NO_PROBE, "dim"))
            return lines, None
        lines.extend(rank_line(rv, v.thresholds) for rv in v.ranks[:8])
        first = v.ranks[0]
        for rv in ledger_ranks(v.ranks):
            lines.append(ledger_line(rv, width))
        if v.capture is not None:  # the file's path is the job's word (its probe's directory): text, one line
            lines.append(Line("captured ", "bold").append(one_line(short(v.capture), 400), "dim"))
        if first.step_time and any(x is not None for x in first.step_time):
            times = [x for x in first.step_time if x is not None]
            hi = max(times) * 1.2 or 1.0
            step = Line("step  ", "bold").extend(spark(first.step_time, 0, hi, max(4, width - 20), "cyan"))
            lines.append(step.append(f" {times[-1] * 1000:.0f} ms"))
        return lines, (first if first.sample.cuda else None)

    def _gpu_processes(self, v: ProcessView) -> list[Line]:
        """With no job attached: whose processes hold the GPUs, the busiest first, as many as fit."""
        procs = v.gpu_procs
        if self.compact:
            more = f" (+{len(procs) - 1} more)" if len(procs) > 1 else ""
            return [Line(proc_text(procs[0], gpu=True) + more)]
        room = max(1, (self.content_size.height or 6) - 1)
        shown = procs if len(procs) <= room else procs[: room - 1]
        lines = [Line(f"GPU processes ({len(procs)}) · ", "dim").append("traintop --pid N", "bold")
                 .append(" attaches to one", "dim")]
        lines.extend(Line(proc_text(gp, gpu=True)) for gp in shown)
        if len(shown) < len(procs):
            lines.append(Line(f"… +{len(procs) - len(shown)} more", "dim"))
        return lines

    def _cpu_history(self, lines: list[Line], v: ProcessView) -> list[Line]:
        """After the end, what the job did up to it (the full layout has the room)."""
        seen = [c for c in v.cpu if c is not None] if v.cpu else []
        if self.compact:
            return lines
        width = self.content_size.width or 60
        if seen:
            cpu = Line("CPU  ", "bold")
            peak = f" peak {max(seen):.0f}\u00a0%"  # the sparkline leaves it room: never "peak 102" / "%"
            cpu.extend(spark(v.cpu, 0, max([100.0] + seen), max(4, width - 6 - len(peak)), "green"))
            lines = lines + [cpu.append(peak)]
        if v.ranks:  # its ranks as last seen, and where their time went
            lines = lines + [Line("its ranks as their probes last reported:", "dim")]
            lines += [rank_line(rv, v.thresholds) for rv in v.ranks[:8]]
            lines += [ledger_line(rv, width) for rv in ledger_ranks(v.ranks)]
        return lines

    _charts: dict | None = None  # kind -> (key, when drawn, rows, the series' bands)

    def _chart(self, rank: RankView, width: int, height: int) -> list[Line]:
        series = (rank.allocated, rank.reserved, rank.nvml)
        return self._cached("gpu", (width, height, rank.sample.pid), series,
                            lambda: memory_chart(rank.allocated, rank.reserved, rank.nvml, width, height))

    def _cached(self, kind: str, key: tuple, series: tuple, draw) -> list[Line]:
        """A chart's lines. Rebuilt (at most every CHART_EVERY_S) when a series leaves the band
        it was drawn in: memory that rises, falls or steps; memory that only wobbles inside its
        band (a step's activations come and go) is redrawn every CHART_IDLE_S so it keeps
        scrolling; and on resize. Never changed in place."""
        now = time.monotonic()
        charts = self._charts if self._charts is not None else {}
        self._charts = charts
        cached = charts.get(kind)
        if cached is not None and cached[0] == key:
            age = now - cached[1]
            if age < CHART_EVERY_S or (age < CHART_IDLE_S and not _left_band(series, cached[3])):
                return cached[2]
        rows = draw()
        charts[kind] = (key, now, rows, [_band(s) for s in series])
        return rows


def member_line(m, width: int) -> Line:
    """One process of the job: its PID and name, then its CPU (a bar to one core), resident
    memory and threads as far as they fit, whole."""
    c = m.cpu_percent or 0.0
    head = Line(f"PID {m.pid:<7} ", "bold").append(f"{one_line(m.name, 16):<16}")
    cpu = bar(c / 100, max(4, min(20, width - 60)), level_style(c / 100, 0.85, 0.95)).append(f" {c:4.0f}\u00a0%")
    parts = [cpu, Line(f"RSS {fmt_bytes(m.rss)}")]
    if m.threads:
        parts.append(Line(f"{m.threads} threads", "dim"))
    if m.is_loader_worker:
        parts.append(Line("loader worker", "dim"))
    return fit_parts(head, parts, width, sep="  ")


def _band(values: list) -> tuple[float, float] | None:
    present = [v for v in values if v is not None]
    return (min(present), max(present)) if present else None


def _left_band(series, bands) -> bool:
    """A series' newest value outside the band it was drawn in (by more than CHART_STEP_BYTES),
    or a series that appeared or vanished."""
    for values, band in zip(series, bands):
        last = values[-1] if values else None
        if (last is None) != (band is None):
            return True
        if last is not None and not band[0] - CHART_STEP_BYTES <= last <= band[1] + CHART_STEP_BYTES:
            return True
    return False
