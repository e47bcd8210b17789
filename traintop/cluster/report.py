"""`traintop analyze --prometheus URL`: the report of a time range of a cluster (or one job).

Per host, the findings are the agents' own: their rules ran on every sample at full rate
and Prometheus carries the verdicts (``traintop_finding_active``); the evidence is
rebuilt from the series over each finding's time. Across hosts, the cross-host rules run
here. Where only dcgm-exporter runs, the local rules run here on its series (dcgm.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from traintop.analyze import WASTE_ALL, WASTE_FROM_CLOCK, WASTE_FROM_UTIL, GpuSummary
from traintop.cluster import crosshost
from traintop.cluster.fetch import ClusterData, GpuData
from traintop.rules import DEFAULT, Severity, Thresholds, declared
from traintop.text import one_line
from traintop.units import GiB, fmt_duration
from traintop.metrics import gpu_index


@dataclass
class ClusterFinding:
    rule: str
    title: str
    host: str
    subject: str
    severity: str
    start: float  # unix time
    end: float
    start_s: float  # from the start of the range
    end_s: float
    duration_s: float
    evidence: str
    remedies: list[str]
    gpu_hours_lost: float
    scope: str  # "host" (an agent's verdict, or a local rule on dcgm series) or "cluster" (a cross-host rule)
    explained_by: str = ""  # an agent's verdict that a cross-host finding explains (ClusterReport.explained)


@dataclass
class HostSummary:
    host: str
    gpus: list[GpuSummary]
    ranks: int
    jobs: list[str]


@dataclass
class ClusterReport:
    source: str
    kind: str  # prometheus (traintop agents) or dcgm-exporter
    job: str | None
    start: float
    end: float
    duration_s: float
    step_s: float
    hosts: list[HostSummary]
    findings: list[ClusterFinding]
    gpu_hours: float
    gpu_hours_lost: float
    notes: list[str] = field(default_factory=list)
    explained: list[ClusterFinding] = field(default_factory=list)  # agents' verdicts the cross-host view overrides
    queries: int = 0
    bytes_read: int = 0
    seconds: float = 0.0

    def worst(self) -> Severity | None:
        return max((Severity.parse(f.severity) for f in self.findings), default=None)

    def to_dict(self) -> dict:
        return asdict(self)


LAST_POINT_S = 30.0  # what a point with no neighbour on the grid stands for (a few scrapes)


def _weight(series: dict, t: float, step: float) -> float:
    """The seconds a grid point stands for: the step where the series goes on to the next point;
    a point with nothing after it (the end of the data, a range or step far longer than the data)
    stands for a few scrapes, not a whole step: 3 minutes of data asked with --since 1w --step 1h
    would otherwise count hours."""
    return step if (t + step) in series else min(step, LAST_POINT_S)


def _lost_hours(series: dict, a: float, b: float, step: float, unused) -> float:
    total = 0.0
    for t, v in series.items():
        if a <= t <= b:
            total += max(0.0, min(1.0, unused(v))) * _weight(series, t, step)
    return total / 3600.0


def _present_hours(series: dict, step: float) -> float:
    """GPU-hours of data present in one GPU's series (not the range asked)."""
    return sum(_weight(series, t, step) for t in series) / 3600.0


def _gpu_evidence(g: GpuData, a: float, b: float) -> str:
    def mean(d):
        vals = [v for t, v in d.items() if a <= t <= b]
        return sum(vals) / len(vals) if vals else None
    parts = []
    u = mean(g.util)
    if u is not None:
        parts.append(f"utilization mean {u * 100:.0f} %")
    p = mean(g.power)
    if p is not None:
        parts.append(f"power mean {p:.0f} W" + (f" of {g.power_limit:.0f} W" if g.power_limit else ""))
    c = mean(g.clock_ratio)
    if c is not None and c < 0.95:
        parts.append(f"SM clock {c * 100:.0f} % of max")
    m = [v for t, v in g.mem_used.items() if a <= t <= b]
    if m:
        parts.append(f"memory peak {max(m) / GiB:.1f}" + (f" of {g.mem_total / GiB:.0f} GiB" if g.mem_total else " GiB"))
    return ", ".join(parts)


def agent_findings(data: ClusterData) -> list[ClusterFinding]:
    out = []
    merged: dict[tuple, dict] = {}
    for f in data.findings:  # one series per severity: merge them, keep the worst
        key = (f.host, f.rule, f.subject)
        m = merged.setdefault(key, {"times": set(), "severity": f.severity})
        m["times"].update(f.times)
        try:
            if Severity.parse(f.severity) > Severity.parse(m["severity"]):
                m["severity"] = f.severity
        except ValueError:
            pass
    for (host, rule_id, subject), m in sorted(merged.items()):
        rule = declared(rule_id)  # a single-host rule's, or a claim an agent raises about its own node
        for a, b in crosshost.spans(sorted(m["times"]), data.step, 0.0):
            b_end = min(b + data.step, data.end)
            evidence = f"{host}'s agent judged it over {fmt_duration(b_end - a)}"
            lost = 0.0
            if (i := gpu_index(subject)) is not None:
                g = data.gpus.get((host, i))
                if g is not None:
                    detail = _gpu_evidence(g, a, b_end)
                    evidence += f"; GPU {g.index} meanwhile: {detail}" if detail else ""
                    if rule_id in WASTE_ALL:
                        lost = _lost_hours(g.util, a, b, data.step, lambda v: 1.0)
                    elif rule_id in WASTE_FROM_UTIL:
                        lost = _lost_hours(g.util, a, b, data.step, lambda v: 1 - v)
                    elif rule_id in WASTE_FROM_CLOCK:
                        lost = _lost_hours(g.clock_ratio, a, b, data.step, lambda v: 1 - v)
            out.append(_finding(data, rule_id, rule.title if rule else rule_id, host, subject, m["severity"], a,
                                b_end, evidence, list(rule.remedies) if rule else [], lost, "host"))
    return out


def _finding(data, rule, title, host, subject, severity, a, b, evidence, remedies, lost, scope) -> ClusterFinding:
    return ClusterFinding(rule, one_line(title, 80), one_line(host, 128), one_line(subject, 128), severity,
                          round(a, 3), round(b, 3), round(a - data.start, 1), round(b - data.start, 1),
                          round(b - a, 1), one_line(evidence, 1000), remedies, round(lost, 4), scope)


def cross_findings(data: ClusterData, config: Thresholds = DEFAULT) -> list[ClusterFinding]:
    return [_cross(data, c) for c in crosshost.evaluate(data, config)]


def _cross(data: ClusterData, c) -> ClusterFinding:
    end = min(c.end + data.step, data.end)
    lost = 0.0
    if c.rule is crosshost.STALLED and c.job is not None:
        # nothing trains: every GPU of the job's hosts loses its time (a spinning collective reads 100 %)
        hosts = {r.host for r in data.jobs().get(c.job, ())}
        lost = sum(_lost_hours(g.util, c.start, end, data.step, lambda v: 1.0)
                   for (h, _), g in data.gpus.items() if h in hosts)
    return _finding(data, c.rule.id, c.rule.title, c.host, c.subject, c.rule.severity.label, c.start,
                    end, c.evidence, list(c.rule.remedies), lost, "cluster")


def findings_of(data: ClusterData, config: Thresholds = DEFAULT) -> tuple[list[ClusterFinding], list[ClusterFinding]]:
    """(findings, explained): the agents' and the cross-host findings, less the agents' verdicts that
    a cross-host finding explains (its rule's ``explains``, on its job's GPUs). An agent sees one
    node: a rank that waits in its collectives for a straggler on another node looks starved or
    underused from there, and is neither."""
    host = agent_findings(data)
    cross = crosshost.evaluate(data, config)
    shown_cross = [_cross(data, c) for c in cross]
    jobs = data.jobs()
    lagging = []  # (finding shown, its lagging GPUs, every GPU of its job), built once each
    for c, cf in zip(cross, shown_cross):
        if c.rule.explains and c.job in jobs:
            ranks = jobs[c.job]
            lagging.append((c, cf, {(r.host, r.local_rank) for r in ranks if r.rank in c.ranks},
                            {(r.host, r.local_rank) for r in ranks}))
    kept, explained = [], []
    for f in host:
        hit = _explaining(f, lagging) if lagging else None
        if hit is None:
            kept.append(f)
            continue
        cf, why = hit
        cf.gpu_hours_lost = round(cf.gpu_hours_lost + f.gpu_hours_lost, 4)
        f.explained_by = one_line(why, 300)
        explained.append(f)
    return kept + shown_cross, explained


def _explaining(f: ClusterFinding, lagging: list):
    i = gpu_index(f.subject)
    if i is None:
        return None
    gpu = (f.host, i)
    for c, cf, slow, job_gpus in lagging:
        if f.rule not in c.rule.explains or gpu not in job_gpus:
            continue
        # most of the agent's verdict lies within the straggler's time
        if crosshost.overlap(f.start, f.end, cf.start, cf.end) < 0.5 * max(f.end - f.start, 1e-9):
            continue
        who = f"{c.subject} on {c.host}"
        if gpu in slow:
            return cf, f"the cause of '{c.rule.title}' ({who}): its input, in that finding's evidence"
        return cf, f"waits in its collectives for {who} ('{c.rule.title}')"
    return None


def summarise(data: ClusterData, findings: list[ClusterFinding], kind: str, job: str | None,
              notes=(), explained=()) -> ClusterReport:
    hosts = []
    jobs = data.jobs()
    n_gpus = 0
    present = 0.0
    for h in data.hosts:
        gpus = []
        for (gh, i), g in sorted(data.gpus.items()):
            if gh != h:
                continue
            s = GpuSummary(i, g.model)
            present += _present_hours(g.util, data.step)
            u = list(g.util.values())
            p = list(g.power.values())
            s.samples = len(u)
            s.util_mean = round(100 * sum(u) / len(u), 1) if u else None
            s.util_peak = round(100 * max(u), 1) if u else None
            s.power_mean = round(sum(p) / len(p), 1) if p else None
            s.power_peak = round(max(p), 1) if p else None
            s.power_limit = g.power_limit
            s.mem_peak_gib = round(max(g.mem_used.values()) / GiB, 2) if g.mem_used else None
            s.mem_total_gib = round(g.mem_total / GiB, 1) if g.mem_total else None
            s.temp_peak = max(g.temp.values()) if g.temp else None
            gpus.append(s)
        n_gpus += len(gpus)
        ranks = [r for rs in jobs.values() for r in rs if r.host == h]
        hosts.append(HostSummary(h, gpus, len(ranks), sorted({r.job for r in ranks})))
    duration = data.end - data.start
    findings.sort(key=lambda f: (f.start, f.scope, f.host, f.rule))
    notes = list(dict.fromkeys(list(data.notes) + list(notes)))
    return ClusterReport(data.url, kind, job, round(data.start, 3), round(data.end, 3), round(duration, 1),
                         round(data.step, 3), hosts, findings, round(present, 4),
                         round(sum(f.gpu_hours_lost for f in findings), 4), notes, list(explained))


def render_text(r: ClusterReport) -> str:
    span = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.start)) + " to " + time.strftime("%H:%M:%S UTC",
                                                                                         time.gmtime(r.end))
    n_gpus = sum(len(h.gpus) for h in r.hosts)
    out = [f"traintop analyze — {r.source} ({r.kind})" + (f", job {r.job}" if r.job else ""),
           f"{span} ({fmt_duration(r.duration_s)}, every {r.step_s:g} s): {len(r.hosts)} host(s), {n_gpus} GPU(s), "
           f"{r.gpu_hours:.3f} GPU-hours; lost to findings: {r.gpu_hours_lost:.3f} GPU-hours"]
    for h in r.hosts:
        utils = [g.util_mean for g in h.gpus if g.util_mean is not None]
        out.append(f"  {h.host}: {len(h.gpus)} GPU(s)"
                   + (f", utilization mean {sum(utils) / len(utils):.0f} %" if utils else "")
                   + (f", {h.ranks} rank(s) of job {', '.join(h.jobs)}" if h.ranks else ""))
    for note in r.notes:
        out.append(f"  note: {note}")
    if not r.findings:
        out.append("No findings: nothing wasted GPU time that traintop recognises.")
    for f in r.findings:
        if f.scope == "cluster":
            subject = f.host if f.subject == f.host else f"{f.host} ({f.subject})"
        else:
            subject = f"{f.host} {_subject(f.subject)}"
        out.append("")
        out.append(f"[{f.severity.upper()}] {f.title} — {subject}, {fmt_duration(f.start_s)} to "
                   f"{fmt_duration(f.end_s)} ({fmt_duration(f.duration_s)})"
                   + (f", {f.gpu_hours_lost:.3f} GPU-hours lost" if f.gpu_hours_lost else ""))
        out.append(f"  {f.evidence}")
        for rem in f.remedies:
            out.append(f"  → {rem}")
    if r.explained:
        out.append("")
        out.append("Explained by the findings above (an agent sees only its own node):")
        for f in r.explained:
            out.append(f"  {f.title} — {f.host} {_subject(f.subject)}, {fmt_duration(f.start_s)} to "
                       f"{fmt_duration(f.end_s)}: {f.explained_by}")
    return "\n".join(out)


def _subject(s: str) -> str:
    if (i := gpu_index(s)) is not None:
        return f"GPU {i}"
    if s.startswith("rank") and s[4:].isdigit():
        return f"rank {s[4:]}"
    return s


def render_json(r: ClusterReport) -> str:
    return json.dumps(r.to_dict(), indent=1)
