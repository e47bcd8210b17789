"""`traintop analyze FILE`: a headless report of a recording or an nvidia-smi log.

The rules run over every sample as they would live — unless the recording says that the
same rules, with the same thresholds, judged it while it was made: then its recorded
alerts are the findings, and the summary is computed column by column without building
frames (a day of 8 GPUs in seconds, not minutes). Each finding gets the GPU-hours it
cost: the time it lasted × the share of the GPU left unused meanwhile — 1 − utilization
for starvation and underuse, 1 − SM clock / max clock for throttling. Findings that do not
waste GPU time by themselves (creeping memory, fragmentation, information) cost 0.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from array import array
from dataclasses import asdict, dataclass, field

from traintop.errors import TraintopError
from traintop.monitor import Monitor
from traintop.rules import DEFAULT, Severity, Thresholds, default_engine
from traintop.stacks import NO_STEP
from traintop.text import plain
from traintop.units import GiB, fmt_duration
from traintop.metrics import gpu_index

# What a finding costs, in GPU time: the GPU's idle share (or its clock's shortfall) while it
# lasted. A finding about the job's GPUs together ("gpus": imbalance) costs every GPU's idle
# share: a rank waiting for a slower one loses that time as surely as a starved one.
WASTE_FROM_UTIL = {"starvation", "underuse", "imbalance", "idle_gpu"}
WASTE_FROM_CLOCK = {"thermal"}
WASTE_ALL = {"stall"}  # nothing trains: the GPU's whole time is lost (a spinning collective reads 100 %)


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
    energy_kwh: float = 0.0  # what the finding's GPU(s) drew while it lasted
    explained_by: str = ""  # the stronger finding that explains this one ("stall gpu0"); its hours go there


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
    energy_kwh: float = 0.0  # the run's, all GPUs: the energy counter where recorded, else power × time
    skipped_chunks: int = 0  # damaged chunks of a recording that could not be read
    skipped_lines: int = 0  # unreadable lines of an imported log
    # where the job's threads were: the probes' stack dumps (the latest of each process)
    stacks: list[dict] = field(default_factory=list)

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
        self.power = array("d")  # W (NaN when unknown)
        self.energy = array("d")  # J, NVML's counter since the driver loaded (NaN when unknown)
        self._prefix: dict[int, list[float]] = {}

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
        self.power.append(g.power_w if g.power_w is not None else float("nan"))
        self.energy.append(g.energy_j if g.energy_j is not None else float("nan"))

    def merge(self, other: "_Acc") -> "_Acc":
        """This accumulator followed by ``other`` (a later run of chunks of the same GPU)."""
        s, o = self.s, other.s
        s.samples += o.samples
        self.util_sum += other.util_sum
        self.util_n += other.util_n
        self.power_sum += other.power_sum
        self.power_n += other.power_n
        for f in ("util_peak", "power_peak", "mem_peak_gib", "temp_peak"):
            vals = [v for v in (getattr(s, f), getattr(o, f)) if v is not None]
            setattr(s, f, max(vals) if vals else None)
        s.power_limit = o.power_limit or s.power_limit
        s.mem_total_gib = o.mem_total_gib or s.mem_total_gib
        self.t.extend(other.t)
        self.unused_util.extend(other.unused_util)
        self.unused_clock.extend(other.unused_clock)
        self.power.extend(other.power)
        self.energy.extend(other.energy)
        return self

    def finish(self) -> GpuSummary:
        s = self.s
        s.util_mean = self.util_sum / self.util_n if self.util_n else None
        s.power_mean = self.power_sum / self.power_n if self.power_n else None
        return s

    def energy_kwh(self, t0: float, t1: float) -> float:
        """What this GPU drew over [t0, t1]: the energy counter's rise between the first and
        the last time it was read inside the span, with power integrated over the edges
        before and after; power integrated over time where the counter was not recorded.
        The counter is read every 30 s (each tick repeats the last reading), so the ends of
        the span are where a new reading first appears, not the span's own ends."""
        t, e = self.t, self.energy
        i0, i1 = bisect.bisect_left(t, t0), bisect.bisect_right(t, t1) - 1
        j0 = next((j for j in range(i0 + 1, i1 + 1) if e[j] == e[j] and e[j] != e[j - 1]), None)
        j1 = next((j for j in range(i1, i0, -1) if e[j] == e[j] and e[j] != e[j - 1]), None)
        if j0 is not None and j1 is not None and j1 > j0 and e[j1] >= e[j0] and e[j0 - 1] == e[j0 - 1]:
            edges = self.lost_hours(t0, t[j0], self.power) + self.lost_hours(t[j1], t1, self.power)
            return (e[j1] - e[j0]) / 3.6e6 + edges / 1000.0
        return self.lost_hours(t0, t1, self.power) / 1000.0  # W·h -> kWh

    def lost_hours(self, t0: float, t1: float, series: array) -> float:
        """Integral of ``series`` over [t0, t1] in hours (each sample holds until the next),
        from prefix sums built once per series: a day-long finding costs two bisections."""
        t = self.t
        if not t:
            return 0.0
        prefix = self._prefix.get(id(series))
        if prefix is None:
            from itertools import accumulate
            steps = [max(0.0, v) * (b - a) if v == v else 0.0 for v, a, b in zip(series, t, t[1:])]
            prefix = self._prefix[id(series)] = [0.0, *accumulate(steps)]
        i0 = bisect.bisect_left(t, t0)
        i1 = bisect.bisect_right(t, t1) - 1
        if i1 < i0:
            return 0.0
        total = prefix[i1] - prefix[i0]
        v = series[i1]
        if v == v and i1 + 1 < len(t):
            total += max(0.0, v) * (min(t[i1 + 1], t1) - t[i1])
        return total / 3600.0


def analyze(source, config: Thresholds | None = None, name: str = "", rerun: bool = False) -> Report:
    report = _analyze(source, config, name, rerun)
    report.stacks = _stacks(source, report)
    return report


def _stacks(source, report: Report) -> list[dict]:
    from traintop.stacks import innermost, latest_per_process

    dumps = source.stacks() if hasattr(source, "stacks") else []
    if not dumps:
        return []
    # a stall's dumps say where it hangs; without a stall, the last dumps asked for
    chosen = latest_per_process(dumps, "stalled") or latest_per_process(dumps)
    t0 = getattr(source, "t_start", None) or dumps[0].t
    return [{"t_s": round(d.t - t0, 1), "label": d.label, "pid": d.pid, "rank": d.rank, "reason": d.reason,
             "since_step_s": None if d.since_step is None else round(d.since_step, 1),
             "threads": [{"name": th.name, "main": th.main, "innermost": innermost(th, 4)} for th in d.threads]}
            for d in chosen]


def _analyze(source, config: Thresholds | None, name: str, rerun: bool) -> Report:
    if not rerun and hasattr(source, "judged_by") and source.judged_by(config):  # logs are never judged
        return _from_recorded(source, name)
    info = source.info
    monitor = Monitor(info, engine=default_engine(config) if config else None)
    accs: dict[int, _Acc] = {}
    names = {g.index: g.name for g in info.gpus}
    first = last = None
    n = 0
    kept: list | None = []  # a short source's frames, to judge again over its whole length
    for f in source.frames():
        monitor.ingest(f)
        n += 1
        first = f.t if first is None else first
        last = f.t
        if kept is not None:
            kept.append(f)
            if len(kept) > SHORT_MAX_FRAMES or last - first > SHORT_S:
                kept = None
        for g in f.gpus:
            acc = accs.get(g.index)
            if acc is None:
                acc = accs[g.index] = _Acc(g.index, names.get(g.index, "GPU"))
            acc.add(f.t, g)
    if first is None:
        _nothing_read(source, name)
    monitor.engine.close_all(last)
    if kept is not None and last - first >= SHORT_MIN_S:
        alerts, note = _judge_short(info, kept, config or DEFAULT, last - first)
        if note:
            return _report(source, name, alerts, accs, first, last, n, notes=(note,))
    return _report(source, name, monitor.engine.alerts, accs, first, last, n)


SHORT_S = 60.0  # a source shorter than the rules' windows (up to a minute here) ...
SHORT_MIN_S = 15.0  # ... but long enough to say anything
SHORT_MAX_FRAMES = 20_000


def _judge_short(info, frames, config: Thresholds, span: float):
    """Rules whose windows are longer than the whole source judge it all: their windows cut to
    (most of) its length. Returns the alerts and a note saying so (no note: nothing was cut)."""
    from dataclasses import fields

    cut = max(SHORT_MIN_S * 0.8, 0.8 * span)
    longer = {f.name: getattr(config, f.name) for f in fields(config)
              if f.name.endswith("_window_s") and getattr(config, f.name) > cut}
    if not longer:
        return [], None
    short = config.with_overrides(**{k: cut for k in longer})
    monitor = Monitor(info, engine=default_engine(short))
    for f in frames:
        monitor.ingest(f)
    monitor.engine.close_all(frames[-1].t)
    note = (f"this source covers {fmt_duration(span)}, less than some rules' windows (up to "
            f"{fmt_duration(max(longer.values()))}): they judged the whole of it ({fmt_duration(cut)} windows)")
    return monitor.engine.alerts, note


def _report(source, name, alerts, accs, first, last, n, notes=()) -> Report:
    info = source.info
    findings = []
    for a in sorted(alerts, key=lambda a: (a.start, a.rule)):
        lost = energy = 0.0
        for acc in _gpus_of(a.subject, accs):
            if a.explained_by:
                pass  # counted once, by the finding that explains it
            elif a.rule in WASTE_ALL:
                lost += max(0.0, min(a.end, acc.t[-1] if acc.t else a.end) - max(a.start, acc.t[0] if acc.t else a.start)) / 3600
            elif a.rule in WASTE_FROM_UTIL:
                lost += acc.lost_hours(a.start, a.end, acc.unused_util)
            elif a.rule in WASTE_FROM_CLOCK:
                lost += acc.lost_hours(a.start, a.end, acc.unused_clock)
            energy += acc.energy_kwh(a.start, a.end)
        findings.append(ReportFinding(a.rule, a.title, a.subject, a.severity.label, round(a.start - first, 1),
                                      round(a.end - first, 1), round(a.end - a.start, 1), a.evidence,
                                      list(a.remedies), round(lost, 4), round(energy, 4), a.explained_by or ""))
    duration = last - first
    gpus = [accs[i].finish() for i in sorted(accs)]
    notes = list(getattr(source, "notes", [])) + list(notes)
    chunks = getattr(source, "skipped_chunks", 0)
    lines = getattr(source, "skipped_lines", 0)
    if chunks:
        total = getattr(source, "chunk_total", None)
        notes.append(f"{chunks}{f' of {total}' if total else ''} chunk(s) could not be read (damaged) and were "
                     "skipped: the findings cover the rest")
    if lines:
        notes.append(f"{lines} unreadable line(s) skipped")
    energy = sum(acc.energy_kwh(first, last) for acc in accs.values())
    bad = getattr(source, "meta", {}).get("probe_bad_messages", "")
    if bad.isdigit() and len(bad) < 12 and int(bad):
        notes.append(f"the probe sent {int(bad)} malformed message(s) while recording; they were dropped")
    return Report(name, getattr(source, "kind", "traintop recording"), round(duration, 1), n, info.interval, gpus,
                  findings, round(duration / 3600 * len(gpus), 4), round(sum(f.gpu_hours_lost for f in findings), 4),
                  notes, round(energy, 4), skipped_chunks=chunks, skipped_lines=lines)


def _gpus_of(subject: str, accs: dict) -> list:
    """The GPUs a finding is about: one ("gpu3"), all of them ("gpus"), or none (host, process, a rank)."""
    i = gpu_index(subject)
    if i is not None:
        return [accs[i]] if i in accs else []
    return list(accs.values()) if subject == "gpus" else []


def _nothing_read(source, name: str):
    """No sample could be read: a report of "no findings" would pass a CI gate on a file that
    said nothing, so this is an error."""
    skipped = getattr(source, "skipped_chunks", 0)
    total = getattr(source, "chunk_total", skipped)
    if skipped:
        why = getattr(source, "damage", None)
        raise TraintopError(f"{name}: none of its {total} chunk(s) could be read ({why or 'all damaged'}); "
                            "nothing to analyze")
    raise TraintopError(f"{name} holds no samples; nothing to analyze")


def _last(col):
    """The last value of a column that is (nearly always) constant: the limit, the total, the max clock."""
    if not col:
        return None
    for v in reversed(col):
        if v is not None:
            return v
    return None


_GPU_COLS = ("util", "power_w", "power_limit_w", "mem_used", "mem_total", "temp_c", "sm_clock", "sm_clock_max",
             "energy_j")


def _from_recorded(source, name) -> Report:
    """The recording's own alerts, and the summary from its columns (no frames, no rules).
    A long recording is summarised by several processes, each over a run of chunks."""
    names = {g.index: g.name for g in source.info.gpus}
    ids = source.chunk_ids()
    parts = _summarise_parallel(source.path, names, ids) if len(ids) >= PARALLEL_MIN_CHUNKS else None
    if parts is None:
        parts = [_summarise(source, names, ids)]
    accs: dict[int, _Acc] = {}
    first = last = None
    n = skipped = 0
    for p_accs, p_first, p_last, p_n, p_skipped, p_damage in parts:
        n += p_n
        skipped += p_skipped
        if p_damage and not getattr(source, "damage", None):
            source.damage = p_damage
        if p_first is None:
            continue
        first = p_first if first is None else first
        last = p_last
        for gi, acc in p_accs.items():
            accs[gi] = acc if gi not in accs else accs[gi].merge(acc)
    if hasattr(source, "skipped_chunks"):
        source.skipped_chunks += skipped
    if first is None:
        _nothing_read(source, name)
    # still active when the recording ended: they end at its last sample
    alerts = [dataclasses.replace(a, end=last) if a.end is None or a.end > last else a for a in source.alerts()]
    return _report(source, name, alerts, accs, first, last, n,
                   notes=["findings as the rules judged them while recording (--rerun re-runs them)"])


PARALLEL_MIN_CHUNKS = 48  # about four hours of 8 GPUs at 2 Hz: below that one process is quicker


def _summarise_parallel(path: str, names: dict, ids: list[int]):
    """Runs of chunks summarised in worker processes (None: not possible here, do it in-process)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    workers = min(os.cpu_count() or 1, 8, len(ids) // 16)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None  # fork: the workers need nothing but this module, already imported
    step = -(-len(ids) // workers)
    runs = [ids[k:k + step] for k in range(0, len(ids), step)]
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_summarise_path, [path] * len(runs), [names] * len(runs), runs))
    except (OSError, RuntimeError, ImportError):  # no processes here (sandbox, frozen app): one is enough
        return None


def _summarise_path(path: str, names: dict, ids: list[int]):
    from traintop.recording import RecordingReader

    reader = RecordingReader(path)
    try:
        return _summarise(reader, names, ids)
    finally:
        reader.close()


def _summarise(source, names: dict, ids: list[int]):
    """Per-GPU accumulators over the chunks ``ids`` (in time order), from their columns only."""
    from traintop.codec import SCHEMES, gpu_column

    accs: dict[int, _Acc] = {}
    first = last = None
    n = 0
    nan = float("nan")
    indices = sorted(names) or list(range(64))
    wanted = [gpu_column(i, c) for i in indices for c in _GPU_COLS]
    before = getattr(source, "skipped_chunks", 0)
    for codec, times, cols in source.columns(wanted, ids):
        if not times:
            continue
        scale = SCHEMES[codec][0]
        n += len(times)
        first = times[0] if first is None else first
        last = times[-1]
        for gi in sorted({int(k[1:k.index(".")]) for k in cols}):
            def col(name: str, gi=gi):
                return cols.get(gpu_column(gi, name))

            u, pw = col("util"), col("power_w")
            u_vals = [v for v in u if v is not None] if u else []
            pw_vals = [v for v in pw if v is not None] if pw else []
            if not u_vals and not pw_vals:
                continue
            acc = accs.get(gi)
            if acc is None:
                acc = accs[gi] = _Acc(gi, names.get(gi, "GPU"))
            s = acc.s
            s.samples += len(times)
            if u_vals:
                acc.util_sum += sum(u_vals) / scale["util"]
                acc.util_n += len(u_vals)
                s.util_peak = max(s.util_peak or 0.0, max(u_vals) / scale["util"])
            if pw_vals:
                acc.power_sum += sum(pw_vals) / scale["power_w"]
                acc.power_n += len(pw_vals)
                s.power_peak = max(s.power_peak or 0.0, max(pw_vals) / scale["power_w"])
            limit = _last(col("power_limit_w"))
            s.power_limit = limit / scale["power_limit_w"] if limit is not None else s.power_limit
            mem = max([v for v in col("mem_used") or () if v is not None], default=None)  # MiB
            if mem is not None:
                s.mem_peak_gib = max(s.mem_peak_gib or 0.0, mem / 1024)
            total = _last(col("mem_total"))
            s.mem_total_gib = total / 1024 if total is not None else s.mem_total_gib
            temp = max([v for v in col("temp_c") or () if v is not None], default=None)
            if temp is not None:
                s.temp_peak = max(s.temp_peak or 0.0, temp / scale["temp_c"])
            acc.t.extend(times)
            u100 = 100.0 * scale["util"]
            acc.unused_util.extend([1 - v / u100 if v is not None else nan for v in u] if u else [nan] * len(times))
            sm, mx = col("sm_clock"), _last(col("sm_clock_max"))
            acc.unused_clock.extend([1 - v / mx if v and mx else nan for v in sm] if sm else [nan] * len(times))
            acc.power.extend([v / scale["power_w"] if v is not None else nan for v in pw] if pw else [nan] * len(times))
            en = col("energy_j")
            acc.energy.extend([v / scale["energy_j"] if v is not None else nan for v in en] if en else [nan] * len(times))
    return accs, first, last, n, getattr(source, "skipped_chunks", 0) - before, getattr(source, "damage", None)


def render_text(r: Report) -> str:
    out = [f"traintop analyze — {r.source} ({r.kind})",
           f"{fmt_duration(r.duration_s)}, {r.samples} samples every {r.interval_s:.2g} s, {len(r.gpus)} GPU(s), "
           f"{r.gpu_hours:.3f} GPU-hours, {r.energy_kwh:.3f} kWh; lost to findings: {r.gpu_hours_lost:.3f} GPU-hours"]
    for g in r.gpus:
        def f(v, fmt="{:.0f}"):
            return "–" if v is None else fmt.format(v)
        out.append(f"  GPU {g.index} {g.name}: utilization mean {f(g.util_mean)} % (peak {f(g.util_peak)} %), "
                   f"power mean {f(g.power_mean)} W (peak {f(g.power_peak)} of {f(g.power_limit)} W), "
                   f"memory peak {f(g.mem_peak_gib, '{:.1f}')} of {f(g.mem_total_gib, '{:.0f}')} GiB, "
                   f"temperature peak {f(g.temp_peak)} °C")
    for note in r.notes:
        out.append(f"  note: {note}")
    causes = [fd for fd in r.findings if not fd.explained_by]
    explained = [fd for fd in r.findings if fd.explained_by]
    if not causes:
        out.append("No findings: nothing wasted GPU time that traintop recognises.")
    by_rule: dict[str, float] = {}
    for fd in r.findings:
        by_rule[fd.title] = by_rule.get(fd.title, 0.0) + fd.gpu_hours_lost
    titles = {fd.rule: fd.title for fd in r.findings}
    for fd in causes:
        out.append("")
        began = (f"from before the recording began ({fmt_duration(-fd.start_s)} earlier)" if fd.start_s < 0
                 else fmt_duration(fd.start_s))
        out.append(f"[{fd.severity.upper()}] {fd.title} — {fd.subject.replace('gpu', 'GPU ')}, "
                   f"{began} to {fmt_duration(fd.end_s)} ({fmt_duration(fd.duration_s)})"
                   + (f", {fd.gpu_hours_lost:.3f} GPU-hours lost" if fd.gpu_hours_lost else "")
                   + (f", {fd.energy_kwh:.3f} kWh drawn" if fd.energy_kwh else ""))
        out.append(f"  {fd.evidence}")
        for rem in fd.remedies:
            out.append(f"  → {rem}")
    if explained:
        out.append("")
        out.append("Explained by a stronger finding (not causes of their own; their GPU-hours are counted there):")
        for fd in explained:
            rule, _, subject = fd.explained_by.partition(" ")
            out.append(f"  {fd.title} — {fd.subject.replace('gpu', 'GPU ')}, {fmt_duration(fd.start_s)} to "
                       f"{fmt_duration(fd.end_s)}: explained by {titles.get(rule, rule)} ({subject.replace('gpu', 'GPU ')})")
    if any(by_rule.values()):
        out.append("")
        out.append("GPU-hours lost by finding: " + "; ".join(f"{k} {v:.3f}" for k, v in by_rule.items() if v))
    if r.stacks:
        out.append("")
        out.append("Where the job's threads were (the probes' stack dumps, innermost call last):")
        for d in r.stacks:
            since = f", {fmt_duration(d['since_step_s'])} after its last step" if d["since_step_s"] is not None else ""
            why = NO_STEP if d["reason"] == "stalled" else "on request"
            who = d["label"] if d["rank"] is None else f"{d['label']} (PID {d['pid']})"  # never "PID 7 (PID 7)"
            out.append(f"  {who} at {fmt_duration(d['t_s'])}, {why}{since}:")
            for th in d["threads"]:
                out.append(f"    {th['name']}{' (main)' if th['main'] else ''}:")
                out.extend(f"      {line}" for line in th["innermost"])
    # names, alert texts and notes come from the file: nothing in them may act on a terminal
    return plain("\n".join(out))


def render_json(r: Report) -> str:
    return json.dumps(r.to_dict(), indent=1)
