"""`traintop analyze --prometheus URL`: the report of a time range of a cluster (or one job).

Per host, the findings are the agents' own: their rules ran on every sample at full rate
and Prometheus carries the verdicts (``traintop_finding_active``); the evidence is
rebuilt from the series over each finding's time. Across hosts, the cross-host rules run
here. Where only dcgm-exporter runs, the local rules run here on its series (dcgm.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass, field

from traintop.reports import waste
from traintop.reports.analyze import GpuSummary, ended
from traintop.cluster import judge
from traintop.cluster.fetch import ClusterData, GpuData
from traintop.findings import Finding
from traintop.rules import DEFAULT, Severity, Thresholds, declared
from traintop.rules.across import GRID_RULES
from traintop.rules.across.figures import overlap
from traintop.rules.across.grid import Across
from traintop.rules.declaration import CLUSTER, HOST
from traintop.text import one_line
from traintop.units import GiB, fmt_duration
from traintop.metrics import gpu_index

# A cluster finding is the one record (traintop.findings) with its host and its scope: "host"
# (an agent's verdict, or a local rule on dcgm series) or "cluster" (a cross-host rule).
# (HOST, CLUSTER: rules/declaration.py's scopes)


def finding_json(f: Finding, t0: float) -> dict:
    """A finding as ``analyze --prometheus --json`` writes it (times unix and from ``t0``, the range's start)."""
    end = ended(f)
    return {"rule": f.rule, "title": f.title, "host": f.host, "subject": f.subject, "severity": f.severity.label,
            "start": round(f.start, 3), "end": round(end, 3), "start_s": round(f.start - t0, 1),
            "end_s": round(end - t0, 1), "duration_s": round(end - f.start, 1), "evidence": f.evidence,
            "remedies": list(f.remedies), "gpu_hours_lost": f.gpu_hours, "scope": f.scope,
            "explained_by": f.explained_by or ""}


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
    findings: list[Finding]  # each with its host and scope
    gpu_hours: float
    gpu_hours_lost: float
    notes: list[str] = field(default_factory=list)
    explained: list[Finding] = field(default_factory=list)  # agents' verdicts the cross-host view overrides
    idle_held: list[dict] = field(default_factory=list)  # who holds idle GPUs (idle_held())
    ledger: list[dict] = field(default_factory=list)  # where each job's time went (job_ledgers())
    queries: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    t0: float = 0.0  # the range's start (unix): the findings' times are told from it

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def at(self, t: float) -> float:
        """A time as the report tells it: seconds from the range's start."""
        return round(t - self.t0, 1)

    def to_dict(self) -> dict:
        d = asdict(dataclasses.replace(self, findings=[], explained=[]))
        d["findings"] = [finding_json(f, self.t0) for f in self.findings]
        d["explained"] = [finding_json(f, self.t0) for f in self.explained]
        del d["t0"]
        return d


def gpu_series(g: GpuData, step: float) -> waste.GpuSeries:
    """One GPU's grid series for costing findings (``traintop.waste``): utilization's points are its own."""
    holds = waste.Holds.grid(step)
    return waste.GpuSeries(waste.Series.of_points(g.util, holds, waste.idle_share),
                           waste.Series.of_points(g.clock_ratio, holds, waste.clock_share))


def _gpu_series(data: ClusterData) -> dict:
    """(host, index) -> its series, built once per report."""
    return {k: gpu_series(g, data.step) for k, g in data.gpus.items()}


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


def cluster_finding(f: Finding, host: str, scope: str, gpu_hours: float = 0.0) -> Finding:
    """``f`` as the cluster report shows it: whose it is and its scope, its text cut to one line
    (names and evidence come from Prometheus)."""
    return dataclasses.replace(f, title=one_line(f.title, 80), subject=one_line(f.subject, 128),
                               evidence=one_line(f.evidence, 1000), remedies=tuple(f.remedies),
                               gpu_hours=round(gpu_hours, 4), host=one_line(host, 128), scope=scope)


def _severity(label, default: Severity) -> Severity:
    """A severity by name: an agent's label (its word, read from Prometheus) or a cross-host rule's;
    a name traintop does not know reads as ``default``."""
    if isinstance(label, Severity):
        return label
    try:
        return Severity.parse(label)
    except (ValueError, AttributeError):
        return default


def agent_findings(data: ClusterData, series: dict | None = None) -> list[Finding]:
    """The agents' own findings, read back from their series: already judged (held and released) on
    their hosts, so only put back together here, run by run of the grid instants they were up at (a
    gap of up to two steps is a scrape missed, not an end). Not played through the engine again: at
    128 hosts that doubled analyze's time for no verdict of its own."""
    series = _gpu_series(data) if series is None else series
    merged: dict[tuple, dict] = {}
    for f in data.findings:  # one series per severity: merged, the worst kept
        key = (f.host, f.rule, f.subject)
        sev = _severity(f.severity, _severity(getattr(declared(f.rule), "severity", None), Severity.WARNING))
        m = merged.setdefault(key, {"times": set(), "severity": sev})
        m["times"].update(f.times)
        m["severity"] = max(m["severity"], sev)
    out = []
    for (host, rule_id, subject), m in sorted(merged.items()):
        rule = declared(rule_id)  # a single-host rule's, or a claim an agent raises about its own node
        mine = {i: g for (h, i), g in series.items() if h == host}
        for a, b in _runs(sorted(m["times"]), data.step):
            b_end = min(b + data.step, data.end)
            evidence = f"{host}'s agent judged it over {fmt_duration(b_end - a)}"
            if (i := gpu_index(subject)) is not None:
                g = data.gpus.get((host, i))
                if g is not None:
                    detail = _gpu_evidence(g, a, b_end)
                    evidence += f"; GPU {g.index} meanwhile: {detail}" if detail else ""
            # each grid point it held at stands for its step (a few scrapes at the end of the data)
            lost, _ = waste.finding_cost(rule_id, subject, None, a, b + data.step, mine)
            f = Finding(rule_id, rule.title if rule else rule_id, subject, m["severity"], a, b_end, evidence,
                        tuple(rule.remedies) if rule else ())
            out.append(cluster_finding(f, host, HOST, lost))
    return out


def _runs(times: list[float], step: float) -> list[tuple[float, float]]:
    """Sorted grid instants as (first, last) runs, gaps of up to two steps bridged."""
    out: list[list[float]] = []
    for t in times:
        if out and t - out[-1][1] <= 2.5 * step:
            out[-1][1] = t
        else:
            out.append([t, t])
    return [(x, y) for x, y in out]


def cross_findings(data: ClusterData, config: Thresholds = DEFAULT, rules=GRID_RULES,
                   events=judge.EVENTS) -> list[Finding]:
    """The cross-host findings as the report shows them: each to the grid's step after its last
    point, with the GPU-hours it cost."""
    series = _gpu_series(data)
    x = Across.of(data, config)
    return [_costed(data, x, f, series) for f in judge.judge(data, config, rules, events)]


def _costed(data: ClusterData, x: Across, f: Finding, series: dict) -> Finding:
    end = min(ended(f) + data.step, data.end)
    lost = 0.0
    share = waste.wasted_share(f.rule)
    about = x.job_of(f.host, f.subject) if share is not None else None
    if about is not None:
        ranks = x.jobs[about[0]]
        if share == waste.WHOLE:  # a stalled job: every GPU of its hosts
            hosts = {r.host for r in ranks}
            lost = sum(g.lost_hours(share, f.start, ended(f) + data.step) for (h, _), g in series.items()
                       if h in hosts)
        elif share == waste.OTHERS:
            # a straggler: its GPUs' idle share, which each other GPU of the job in use waits. Where the
            # waiting ranks' agents judged their GPUs, the verdicts it explains say the same from their
            # side: findings_of keeps the larger of the two, never their sum
            lagging = {(r.host, r.local_rank) for r in about[1]}
            waiting = [series[k] for k in {(r.host, r.local_rank) for r in ranks} - lagging if k in series]
            lost = sum(waste.others_waiting_hours(series[k], waiting, f.start, ended(f) + data.step)
                       for k in lagging if k in series)
    return cluster_finding(dataclasses.replace(f, end=end), f.host or "", CLUSTER, lost)


def findings_of(data: ClusterData, config: Thresholds = DEFAULT) -> tuple[list[Finding], list[Finding]]:
    """(findings, explained): the agents' and the cross-host findings, less the agents' verdicts that
    a cross-host finding explains (its rule's ``explains``, on its job's GPUs). An agent sees one
    node: a rank that waits in its collectives for a straggler on another node looks starved or
    underused from there, and is neither."""
    series = _gpu_series(data)
    host = agent_findings(data, series)
    x = Across.of(data, config)
    shown_cross = [_costed(data, x, f, series) for f in judge.judge(data, config)]
    lagging = []  # (index of the cross-host finding, its rule's explains, its lagging GPUs, every GPU of its job)
    for k, f in enumerate(shown_cross):
        rule = declared(f.rule, CLUSTER)
        about = x.job_of(f.host, f.subject) if rule is not None and rule.explains else None
        if rule is not None and about is not None:
            lagging.append((k, rule.explains, {(r.host, r.local_rank) for r in about[1]},
                            {(r.host, r.local_rank) for r in x.jobs[about[0]]}))
    kept, explained = [], []
    folded: dict[int, float] = {}
    for f in host:
        hit = _explaining(f, lagging, shown_cross) if lagging else None
        if hit is None:
            kept.append(f)
            continue
        k, why = hit
        folded[k] = folded.get(k, 0.0) + f.gpu_hours  # the explaining finding counts the explained one's
        explained.append(dataclasses.replace(f, explained_by=one_line(why, 300)))
    for k, hours in folded.items():
        cf = shown_cross[k]
        shown_cross[k] = dataclasses.replace(cf, gpu_hours=round(max(cf.gpu_hours, hours), 4))
    return kept + shown_cross, explained


def _explaining(f: Finding, lagging: list, shown: list[Finding]):
    """The cross-host finding that explains an agent's verdict ``f`` (most of it lies within its
    time, on its job's GPUs), and how, as the report says it."""
    i = gpu_index(f.subject)
    if i is None:
        return None
    gpu = (f.host, i)
    for k, explains, slow, job_gpus in lagging:
        cf = shown[k]
        if f.rule not in explains or gpu not in job_gpus:
            continue
        if overlap(f.start, ended(f), cf.start, ended(cf)) < 0.5 * max(ended(f) - f.start, 1e-9):
            continue
        who = f"{cf.subject} on {cf.host}"
        if gpu in slow:
            return k, f"the cause of '{cf.title}' ({who}): its input, in that finding's evidence"
        return k, f"waits in its collectives for {who} ('{cf.title}')"
    return None


def summarise(data: ClusterData, findings: list[Finding], kind: str, job: str | None,
              notes=(), explained=(), config: Thresholds = DEFAULT) -> ClusterReport:
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
            present += gpu_series(g, data.step).present_hours()
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
                         round(sum(f.gpu_hours for f in findings), 4), notes, list(explained),
                         idle_held(data, config), ledger=job_ledgers(data), t0=data.start)


def job_ledgers(data: ClusterData) -> list[dict]:
    """Each job's ranks' time ledgers summed over the range: rank-hours per bucket and goodput (the
    share in training steps). Rank-hours are GPU-hours where each rank drives one GPU."""
    out = []
    for job, buckets in sorted(data.ledger.items()):
        total = sum(buckets.values())
        if total <= 0:
            continue
        out.append({"job": job, "rank_hours": round(total / 3600, 4), "goodput": round(buckets.get("train", 0) / total, 4),
                    "buckets": {b: {"rank_hours": round(v / 3600, 4), "share": round(v / total, 4)}
                                for b, v in sorted(buckets.items(), key=lambda kv: -kv[1]) if v > 0}})
    return out[:IDLE_HELD_MAX_ROWS]


IDLE_HELD_MIN_BYTES = 512 * 2**20  # memory in use for an idle GPU to count as held (the idle rule's)
IDLE_HELD_MAX_ROWS = 50


def idle_hours_held(data: ClusterData, config: Thresholds = DEFAULT) -> dict[tuple, float]:
    """(host, gpu, owner) -> the GPU-hours that owner's processes held that GPU while it did nothing
    (utilization at most ``idle_max_util`` with memory in use), shared between the owners on one GPU
    by the memory each held (integrated by traintop.waste). Only those above zero."""
    idle = config.idle_max_util / 100
    holds = waste.Holds.grid(data.step)
    out: dict = {}
    for key, owners in data.owners.items():
        g = data.gpus.get(key)
        if g is None:
            continue
        shares: dict = {who: {} for who, _ in owners}
        for t in data.grid:
            u, used = g.util.get(t), g.mem_used.get(t)
            if u is None:
                continue
            held = [(who, vals.get(t, 0.0)) for who, vals in owners]
            total = sum(b for _, b in held if b > 0)
            quiet = u <= idle and (used is None or used >= IDLE_HELD_MIN_BYTES) and total > 0
            for who, b in held:
                shares[who][t] = b / total if quiet and b > 0 else 0.0
        for who, points in shares.items():
            h = waste.Series.of_points(points, holds).hours()
            if h > 0:
                k = (key[0], key[1], who)
                out[k] = out.get(k, 0.0) + h
    return out


def idle_held(data: ClusterData, config: Thresholds = DEFAULT) -> list[dict]:
    """Who holds idle GPUs: for each owner (user, job, pod) the GPU-hours its processes held a GPU
    that did nothing (``idle_hours_held``), the most first. The report a cluster's admin asks for."""
    hours: dict = {}
    where: dict = {}
    for (host, gpu, who), h in idle_hours_held(data, config).items():
        hours[who] = hours.get(who, 0.0) + h
        where.setdefault(who, set()).add((host, gpu))
    rows = sorted(hours.items(), key=lambda kv: -kv[1])[:IDLE_HELD_MAX_ROWS]
    return [{"user": w.user, "uid": w.uid, "job": w.job, "job_from": w.job_from, "pod": w.pod,
             "namespace": w.namespace, "pod_uid": w.pod_uid, "container": w.container,
             "gpu_hours": round(h, 4), "gpus": [f"{host} GPU {i}" for host, i in sorted(where[w])]}
            for w, h in rows if round(h, 4) > 0]


def _owner_name(row: dict) -> str:
    """Whose, as the report says it: what the host vouches for plainly, what the processes claim as theirs."""
    parts = [f"user {row['user']}" if row["user"] else "an unknown user"]
    if row["job"]:
        parts.append(f"Slurm job {row['job']}" if row.get("job_from") == "cgroup" else f"job {row['job']} (its own claim)")
    if row["pod"]:
        parts.append(f"pod {row['namespace'] + '/' if row['namespace'] else ''}{row['pod']} (its own claim)")
    return one_line(", ".join(parts), 200)


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
        if f.scope == CLUSTER:
            subject = f.host if f.subject == f.host else f"{f.host} ({f.subject})"
        else:
            subject = f"{f.host} {_subject(f.subject)}"
        out.append("")
        out.append(f"[{f.severity.label.upper()}] {f.title} — {subject}, {fmt_duration(r.at(f.start))} to "
                   f"{fmt_duration(r.at(ended(f)))} ({fmt_duration(round(ended(f) - f.start, 1))})"
                   + (f", {f.gpu_hours:.3f} GPU-hours lost" if f.gpu_hours else ""))
        out.append(f"  {f.evidence}")
        for rem in f.remedies:
            out.append(f"  → {rem}")
    if r.idle_held:
        out.append("")
        out.append("Who holds idle GPUs (utilization at the idle threshold or below, memory in use):")
        for row in r.idle_held:
            gpus = ", ".join(one_line(g, 140) for g in row["gpus"][:4]) + (" …" if len(row["gpus"]) > 4 else "")
            out.append(f"  {_owner_name(row)}: {row['gpu_hours']:.3f} GPU-hours held idle ({gpus})")
    if r.ledger:
        out.append("")
        out.append("Where each job's time went (its ranks' time ledgers; goodput = the share in training steps):")
        for row in r.ledger:
            parts = " · ".join(f"{b} {v['share'] * 100:.0f} % ({v['rank_hours']:.3f} h)"
                               for b, v in row["buckets"].items() if v["share"] >= 0.005)
            out.append(f"  job {one_line(row['job'], 128)}: goodput {row['goodput'] * 100:.0f} % of "
                       f"{row['rank_hours']:.3f} rank-hours — {parts}")
    if r.explained:
        out.append("")
        out.append("Explained by the findings above (an agent sees only its own node):")
        for f in r.explained:
            out.append(f"  {f.title} — {f.host} {_subject(f.subject)}, {fmt_duration(r.at(f.start))} to "
                       f"{fmt_duration(r.at(ended(f)))}: {f.explained_by}")
    return "\n".join(out)


def _subject(s: str) -> str:
    if (i := gpu_index(s)) is not None:
        return f"GPU {i}"
    if s.startswith("rank") and s[4:].isdigit():
        return f"rank {s[4:]}"
    return s


def render_json(r: ClusterReport) -> str:
    return json.dumps(r.to_dict(), indent=1)
