"""`traintop analyze FILE`: a headless report of a recording or an nvidia-smi log.

The rules run over every sample as they would live. Each finding gets the GPU-hours it
cost: the time it lasted × the share of the GPU left unused meanwhile — 1 − utilization
for starvation and underuse, 1 − SM clock / max clock for throttling. Findings that do not
waste GPU time by themselves (creeping memory, fragmentation, information) cost 0.
"""

from __future__ import annotations

import bisect
import json
from array import array
from dataclasses import asdict, dataclass, field

from traintop.monitor import Monitor
from traintop.rules import Severity, Thresholds, default_engine
from traintop.units import GiB, fmt_duration

WASTE_FROM_UTIL = {"starvation", "underuse"}
WASTE_FROM_CLOCK = {"thermal"}


@dataclass
class GpuSummary:
    index: int
    name: str
    samples: int = 0
    util_mean: float | None = None
    util_peak: float | None = None
    power_mean: float | None = None
    power_peak: float | None = None
    power_limit: float | None = None
    mem_peak_gib: float | None = None
    mem_total_gib: float | None = None
    temp_peak: float | None = None


@dataclass
class ReportFinding:
    rule: str
    title: str
    subject: str
    severity: str
    start_s: float  # from the start of the session
    end_s: float
    duration_s: float
    evidence: str
    remedies: list[str]
    gpu_hours_lost: float


@dataclass
class Report:
    source: str
    kind: str
    duration_s: float
    samples: int
    interval_s: float
    gpus: list[GpuSummary]
    findings: list[ReportFinding]
    gpu_hours: float
    gpu_hours_lost: float
    notes: list[str] = field(default_factory=list)

    def worst(self) -> Severity | None:
        return max((Severity.parse(f.severity) for f in self.findings), default=None)

    def to_dict(self) -> dict:
        return asdict(self)


class _Acc:
    def __init__(self, index: int, name: str) -> None:
        self.s = GpuSummary(index, name)
        self.util_sum = self.util_n = self.power_sum = self.power_n = 0.0
        self.t = array("d")
        self.unused_util = array("d")  # 1 - util/100 (NaN when unknown)
        self.unused_clock = array("d")  # 1 - sm/sm_max

    def add(self, t: float, g) -> None:
        s = self.s
        s.samples += 1
        if g.util is not None:
            self.util_sum += g.util
            self.util_n += 1
            s.util_peak = max(s.util_peak or 0.0, g.util)
        if g.power_w is not None:
            self.power_sum += g.power_w
            self.power_n += 1
            s.power_peak = max(s.power_peak or 0.0, g.power_w)
        s.power_limit = g.power_limit_w or s.power_limit
        if g.mem_used is not None:
            s.mem_peak_gib = max(s.mem_peak_gib or 0.0, g.mem_used / GiB)
        if g.mem_total:
            s.mem_total_gib = g.mem_total / GiB
        if g.temp_c is not None:
            s.temp_peak = max(s.temp_peak or 0.0, g.temp_c)
        self.t.append(t)
        self.unused_util.append(1 - g.util / 100 if g.util is not None else float("nan"))
        ratio = g.sm_clock / g.sm_clock_max if g.sm_clock and g.sm_clock_max else None
        self.unused_clock.append(1 - ratio if ratio is not None else float("nan"))

    def finish(self) -> GpuSummary:
        s = self.s
        s.util_mean = self.util_sum / self.util_n if self.util_n else None
        s.power_mean = self.power_sum / self.power_n if self.power_n else None
        return s

    def lost_hours(self, t0: float, t1: float, series: array) -> float:
        """Integral of ``series`` over [t0, t1] in hours (each sample holds until the next)."""
        i = bisect.bisect_left(self.t, t0)
        total = 0.0
        while i < len(self.t) and self.t[i] <= t1:
            nxt = self.t[i + 1] if i + 1 < len(self.t) else self.t[i]
            v = series[i]
            if v == v:
                total += max(0.0, v) * (min(nxt, t1) - self.t[i])
            i += 1
        return total / 3600.0


def analyze(source, config: Thresholds | None = None, name: str = "") -> Report:
    info = source.info
    monitor = Monitor(info, engine=default_engine(config) if config else None)
    accs: dict[int, _Acc] = {}
    names = {g.index: g.name for g in info.gpus}
    first = last = None
    n = 0
    for f in source.frames():
        monitor.ingest(f)
        n += 1
        first = f.t if first is None else first
        last = f.t
        for g in f.gpus:
            acc = accs.get(g.index)
            if acc is None:
                acc = accs[g.index] = _Acc(g.index, names.get(g.index, "GPU"))
            acc.add(f.t, g)
    if first is None:
        return Report(name, getattr(source, "kind", "recording"), 0.0, 0, info.interval, [], [], 0.0, 0.0,
                      ["no samples"])
    monitor.engine.close_all(last)
    findings = []
    for a in sorted(monitor.engine.alerts, key=lambda a: (a.start, a.rule)):
        lost = 0.0
        if a.subject.startswith("gpu"):
            acc = accs.get(int(a.subject[3:]))
            if acc is not None and a.rule in WASTE_FROM_UTIL:
                lost = acc.lost_hours(a.start, a.end, acc.unused_util)
            elif acc is not None and a.rule in WASTE_FROM_CLOCK:
                lost = acc.lost_hours(a.start, a.end, acc.unused_clock)
        findings.append(ReportFinding(a.rule, a.title, a.subject, a.severity.label, round(a.start - first, 1),
                                      round(a.end - first, 1), round(a.end - a.start, 1), a.evidence,
                                      list(a.remedies), round(lost, 4)))
    duration = last - first
    gpus = [accs[i].finish() for i in sorted(accs)]
    notes = list(getattr(source, "notes", []))
    skipped = getattr(source, "skipped_lines", 0) or getattr(source, "skipped_chunks", 0)
    if skipped:
        notes.append(f"{skipped} unreadable line(s)/chunk(s) skipped")
    return Report(name, getattr(source, "kind", "traintop recording"), round(duration, 1), n, info.interval, gpus,
                  findings, round(duration / 3600 * len(gpus), 4), round(sum(f.gpu_hours_lost for f in findings), 4),
                  notes)


def render_text(r: Report) -> str:
    out = [f"traintop analyze — {r.source} ({r.kind})",
           f"{fmt_duration(r.duration_s)}, {r.samples} samples every {r.interval_s:.2g} s, {len(r.gpus)} GPU(s), "
           f"{r.gpu_hours:.3f} GPU-hours; lost to findings: {r.gpu_hours_lost:.3f} GPU-hours"]
    for g in r.gpus:
        def f(v, fmt="{:.0f}"):
            return "–" if v is None else fmt.format(v)
        out.append(f"  GPU {g.index} {g.name}: utilization mean {f(g.util_mean)} % (peak {f(g.util_peak)} %), "
                   f"power mean {f(g.power_mean)} W (peak {f(g.power_peak)} of {f(g.power_limit)} W), "
                   f"memory peak {f(g.mem_peak_gib, '{:.1f}')} of {f(g.mem_total_gib, '{:.0f}')} GiB, "
                   f"temperature peak {f(g.temp_peak)} °C")
    for note in r.notes:
        out.append(f"  note: {note}")
    if not r.findings:
        out.append("No findings: nothing wasted GPU time that traintop recognises.")
    by_rule: dict[str, float] = {}
    for fd in r.findings:
        by_rule[fd.title] = by_rule.get(fd.title, 0.0) + fd.gpu_hours_lost
    for fd in r.findings:
        out.append("")
        out.append(f"[{fd.severity.upper()}] {fd.title} — {fd.subject.replace('gpu', 'GPU ')}, "
                   f"{fmt_duration(fd.start_s)} to {fmt_duration(fd.end_s)} ({fmt_duration(fd.duration_s)})"
                   + (f", {fd.gpu_hours_lost:.3f} GPU-hours lost" if fd.gpu_hours_lost else ""))
        out.append(f"  {fd.evidence}")
        for rem in fd.remedies:
            out.append(f"  → {rem}")
    if any(by_rule.values()):
        out.append("")
        out.append("GPU-hours lost by finding: " + "; ".join(f"{k} {v:.3f}" for k, v in by_rule.items() if v))
    return "\n".join(out)


def render_json(r: Report) -> str:
    return json.dumps(r.to_dict(), indent=1)
