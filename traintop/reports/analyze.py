"""`traintop analyze FILE`: a headless report of a recording or an nvidia-smi log.

The rules run over every sample as they would live — unless the recording says that the
same rules, with the same thresholds, judged it while it was made: then its recorded
alerts are the findings, and the summary is computed column by column without building
frames (a day of 8 GPUs in seconds, not minutes). Each finding gets the GPU-hours it cost
and the energy its GPUs drew, from the samples present (``traintop.reports.waste``).
"""

from __future__ import annotations

import dataclasses
import os
import json
import stat
from array import array
from dataclasses import asdict, dataclass, field
from typing import NoReturn

from traintop.reports import waste
from traintop.errors import TraintopError
from traintop.findings import Finding
from traintop.watch.monitor import Monitor
from traintop.rules import DEFAULT, Severity, Thresholds, default_engine
from traintop.record.evidence import captures_dir, describe, folder_problem
from traintop.injob.capture import CAPTURE_NAME
from traintop.stacks import why_taken
from traintop.reports.time_ledger import TimeLedger
from traintop.reports.time_ledger import render as render_ledger
from traintop.text import plain
from traintop.units import GiB, fmt_clock, fmt_duration


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


def ended(f: Finding) -> float:
    """When a report's finding ended: a report (this one, the cluster's) ends each at its data's end
    at the latest."""
    assert f.end is not None, f"a report's finding has not ended: {f.rule} {f.subject}"
    return f.end


def finding_json(f: Finding, t0: float) -> dict:
    """A finding as ``analyze --json`` writes it: times in seconds from the first sample, the
    severity by name, its GPU-hours as ``gpu_hours_lost``, "" when nothing explains it."""
    end = ended(f)
    return {"rule": f.rule, "title": f.title, "subject": f.subject, "severity": f.severity.label,
            "start_s": round(f.start - t0, 1), "end_s": round(end - t0, 1), "duration_s": round(end - f.start, 1),
            "evidence": f.evidence, "remedies": list(f.remedies), "gpu_hours_lost": f.gpu_hours,
            "energy_kwh": f.energy_kwh, "explained_by": f.explained_by or ""}


@dataclass
class Report:
    source: str
    kind: str
    duration_s: float
    samples: int
    interval_s: float
    gpus: list[GpuSummary]
    findings: list[Finding]  # ended (at the last sample if they held to the end), their GPU-hours and energy filled in
    gpu_hours: float
    gpu_hours_lost: float
    notes: list[str] = field(default_factory=list)
    energy_kwh: float | None = 0.0  # the run's, all GPUs: the energy counter where recorded, else power × time;
    # None where the source holds no power reading (an nvidia-smi pmon log)
    skipped_chunks: int = 0  # damaged chunks of a recording that could not be read
    skipped_lines: int = 0  # unreadable lines of an imported log
    # where the job's threads were: the probes' stack dumps (the latest of each process)
    stacks: list[dict] = field(default_factory=list)
    ledger: list[dict] = field(default_factory=list)  # per rank: where its time went (the probe's time ledger)
    captures: list[dict] = field(default_factory=list)  # evidence captured when findings started
    t0: float = 0.0  # the first sample's time (unix): the findings' times are told from it

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def at(self, t: float) -> float:
        """A time as the report tells it: seconds from the first sample."""
        return round(t - self.t0, 1)

    def to_dict(self) -> dict:
        d = asdict(dataclasses.replace(self, findings=[]))
        d["findings"] = [finding_json(f, self.t0) for f in self.findings]
        del d["t0"]
        return d


class _Acc:
    """One GPU's summary and series, sample by sample (or column by column)."""

    def __init__(self, index: int, name: str) -> None:
        self.s = GpuSummary(index, name)
        self.util_sum = self.util_n = self.power_sum = self.power_n = 0.0
        self.t = array("d")
        self.idle = array("d")  # waste.idle_share (NaN when unknown)
        self.clock = array("d")  # waste.clock_share
        self.power = array("d")  # W (NaN when unknown)
        self.energy = array("d")  # J, NVML's counter since the driver loaded (NaN when unknown)
        self._series: waste.GpuSeries | None = None

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
        self.idle.append(waste.idle_share(g.util / 100 if g.util is not None else None))
        self.clock.append(waste.clock_share(waste.clock_ratio(g.sm_clock, g.sm_clock_max)))
        self.power.append(g.power_w if g.power_w is not None else float("nan"))
        self.energy.append(g.energy_j if g.energy_j is not None else float("nan"))

    def unread(self, times) -> "_Acc":
        """Samples at ``times`` (in order) of which nothing is known but that the GPU was there."""
        nan = array("d", [float("nan")]) * len(times)
        self.s.samples += len(times)
        self.t.extend(times)
        for col in (self.idle, self.clock, self.power, self.energy):
            col.extend(nan)
        return self

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
        self.idle.extend(other.idle)
        self.clock.extend(other.clock)
        self.power.extend(other.power)
        self.energy.extend(other.energy)
        return self

    def finish(self) -> GpuSummary:
        s = self.s
        s.util_mean = self.util_sum / self.util_n if self.util_n else None
        s.power_mean = self.power_sum / self.power_n if self.power_n else None
        return s

    def series(self, interval: float) -> waste.GpuSeries:
        """Its series for costing findings (once all samples are in)."""
        if self._series is None:
            holds = waste.Holds.recording(interval, self.t)
            self._series = waste.GpuSeries(waste.Series(self.t, self.idle, holds),
                                           waste.Series(self.t, self.clock, holds),
                                           power=waste.Series(self.t, self.power, holds),
                                           energy=waste.Series(self.t, self.energy, holds))
        return self._series


def analyze(source, config: Thresholds | None = None, name: str = "", rerun: bool = False) -> Report:
    report = _analyze(source, config, name, rerun)
    report.stacks = _stacks(source, report)
    report.captures = _captures(source, report)
    if not report.ledger and getattr(source, "has_ledger", lambda: False)():
        # the recording's own findings were used: its samples once more, for the ledger
        ledger = TimeLedger({g.index: g.name for g in source.info.gpus})
        for f in source.frames():
            ledger.add(f)
        report.ledger = ledger.report()
    return report


def _beside(source, cap):
    """A capture as it is now: beside the recording where it was moved with it, else where it was kept
    (said missing when neither holds it). A file is pointed to only in a folder of the recording's
    owner that no one else can write, as a plain file of that owner: a memory snapshot is a pickle,
    and someone else's file put in its place would run code in whoever loads it."""
    if cap.path is None or cap.error:
        return cap
    name = os.path.basename(cap.path)
    if not CAPTURE_NAME.fullmatch(name):
        return dataclasses.replace(cap, path=None, error=f"{name!r} is not a capture's name: not pointed to")
    here = getattr(source, "path", None)
    try:
        owner = os.lstat(here).st_uid if here else os.geteuid()
    except OSError:
        owner = os.geteuid()
    if here:
        folder = captures_dir(here)
        problem = _untrusted(folder, name, owner)
        if problem is None:
            return dataclasses.replace(cap, path=os.path.join(folder, name))
        if problem != "missing":
            return dataclasses.replace(cap, path=None, error=f"{problem}: not pointed to")
    problem = _untrusted(os.path.dirname(cap.path), name, owner)
    if problem == "missing":
        return dataclasses.replace(cap, error=f"its file is missing (was {cap.path})")
    if problem is not None:
        return dataclasses.replace(cap, path=None, error=f"{problem}: not pointed to")
    return cap


def _untrusted(folder: str, name: str, owner: int) -> str | None:
    """Why ``folder/name`` is not a capture to point to ("missing" when there is none), else None."""
    try:
        st = os.lstat(folder)
    except OSError:
        return "missing"
    problem = folder_problem(st, owner)
    if problem:
        return f"{folder} {problem}"
    try:
        st = os.lstat(os.path.join(folder, name))
    except OSError:
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{os.path.join(folder, name)} is not a plain file"
    if st.st_uid != owner or st.st_mode & 0o022:
        return f"{os.path.join(folder, name)} is not the recording owner's alone"
    return None


def _captures(source, report: Report) -> list[dict]:
    caps = [_beside(source, c) for c in (source.captures() if hasattr(source, "captures") else [])]
    return [{"t_s": report.at(c.t), "kind": c.kind, "pid": c.pid, "rank": c.rank, "path": c.path, "bytes": c.size,
             "reason": c.reason, "step_s_before": c.step_s_before, "step_s_after": c.step_s_after, "error": c.error,
             "line": describe(c)} for c in caps]


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
    if getattr(source, "gpu_readings", True) is False:  # a pmon log: nothing the rules judge
        return _seen_only(source, name)
    info = source.info
    monitor = Monitor(info, engine=default_engine(config) if config else None)
    monitor.engine.max_history = MAX_FINDINGS  # a report keeps every finding of the run, not the last 500
    judged = None
    if getattr(source, "in_memory", False) and source.t_start is not None:  # a long log: in parts, at once
        from traintop.reports.analyze_parallel import judge_in_parts

        judged = judge_in_parts(source, config, source.t_start, source.t_end, MAX_FINDINGS)
    accs: dict[int, _Acc] = {}
    names = {g.index: g.name for g in info.gpus}
    first = last = None
    n = 0
    kept: list | None = [] if judged is None else None  # a short source's frames, to judge again over its length
    ledger = TimeLedger(names)
    for f in source.frames():
        if judged is None:
            monitor.ingest(f)
        ledger.add(f)
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
    if first is None or last is None:
        _nothing_read(source, name)
    if judged is not None:
        findings, dropped = judged
        report = _report(source, name, findings, accs, first, last, n, notes=_left_out(dropped))
    else:
        monitor.engine.close_all(last)
        report = None
        if kept is not None and last - first >= SHORT_MIN_S:
            alerts, note = _judge_short(info, kept, config or DEFAULT, last - first)
            if note:
                report = _report(source, name, alerts, accs, first, last, n, notes=(note,))
        if report is None:
            report = _report(source, name, monitor.engine.alerts, accs, first, last, n,
                             notes=_left_out(monitor.engine.dropped))
    report.ledger = ledger.report()
    return report


def _seen_only(source, name: str) -> Report:
    """A source without GPU readings (a pmon log): which GPU was seen when, read from its columns;
    no rules and no frames (building a frame a round cost more than reading the file)."""
    names = {g.index: g.name for g in source.info.gpus}
    accs: dict[int, _Acc] = {}
    for i, times in sorted(source.gpu_times().items()):
        accs[i] = _Acc(i, names.get(i, "GPU")).unread(times)
    if source.t_start is None:
        _nothing_read(source, name)
    return _report(source, name, [], accs, source.t_start, source.t_end, source.frame_count)


def _left_out(dropped: int) -> list[str]:
    return [f"{dropped:,} of the earliest findings are left out (more than {MAX_FINDINGS:,}): their GPU-hours "
            "are not counted; analyze a shorter part"] if dropped else []


MAX_FINDINGS = 200_000  # a report's findings (a week of one every few seconds); beyond, the oldest go, said
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
    gpus = {i: acc.series(info.interval) for i, acc in accs.items()}
    findings = []
    for a in sorted(alerts, key=lambda a: (a.start, a.rule)):
        end = last if a.end is None or a.end > last else a.end  # still up when the data ends
        lost, energy = waste.finding_cost(a.rule, a.subject, a.explained_by, a.start, end, gpus)
        findings.append(dataclasses.replace(a, end=end, gpu_hours=round(lost, 4), energy_kwh=round(energy, 4)))
    duration = last - first
    summaries = [accs[i].finish() for i in sorted(accs)]
    notes = list(getattr(source, "notes", [])) + list(notes)
    chunks = getattr(source, "skipped_chunks", 0)
    lines = getattr(source, "skipped_lines", 0)
    if chunks:
        total = getattr(source, "chunk_total", None)
        notes.append(f"{chunks}{f' of {total}' if total else ''} chunk(s) could not be read (damaged) and were "
                     "skipped: the findings cover the rest")
    notes.extend(damage_notes(source, first, last))
    if lines:
        notes.append(f"{lines} unreadable line(s) skipped")
    energy = sum(g.energy_kwh(first, last) for g in gpus.values())
    if not any(s.power_mean is not None for s in summaries):
        energy = None  # nothing says what the GPUs drew: unknown, not 0
    present = sum(g.present_hours() for g in gpus.values())
    bad = getattr(source, "meta", {}).get("probe_bad_messages", "")
    if bad.isdigit() and len(bad) < 12 and int(bad):
        notes.append(f"the probe sent {int(bad)} malformed message(s) while recording; they were dropped")
    unasked = getattr(source, "meta", {}).get("probe_unasked_captures", "")
    if unasked.isdigit() and len(unasked) < 12 and int(unasked):
        notes.append(f"the job's probe sent {int(unasked)} capture record(s) this recording did not ask for (the answers "
                     "to another traintop attached to the same job, or records the job made up); they were not kept")
    return Report(name, getattr(source, "kind", "traintop recording"), round(duration, 1), n, info.interval, summaries,
                  findings, round(present, 4), round(sum(f.gpu_hours for f in findings), 4),
                  notes, None if energy is None else round(energy, 4), skipped_chunks=chunks, skipped_lines=lines, t0=first)


def damage_notes(source, first: float, last: float | None = None) -> list[str]:
    """What a damaged recording lost, told from ``first`` (its first sample read): the spans without
    samples, and, where SQLite refused the file whole (cut short), that it was read part by part."""
    out = []
    if getattr(source, "salvaged", False):
        cut = source.cut
        how = (f"cut short: {cut[0]:,} of the {cut[1]:,} bytes its header counts" if cut else "damaged")
        out.append(f"the file is {how}; SQLite refused it whole, so what it could still read was read chunk by "
                   "chunk, and the rules judged that again (the findings recorded with it may be lost with the rest)")
        if cut and last is not None:
            out.append(f"whatever was recorded after {fmt_duration(last - first)} ({fmt_clock(last)}) is lost "
                       "with the end of the file")
    lost = source.lost() if getattr(source, "salvaged", False) or getattr(source, "skipped_chunks", 0) else []
    if lost:
        out.append("no samples could be read from " + "; ".join(
            f"{fmt_duration(max(0.0, a - first))} to {fmt_duration(b - first)} ({fmt_duration(b - a)})" for a, b in lost[:8])
            + (f"; and {len(lost) - 8} more span(s)" if len(lost) > 8 else ""))
    return out


def damage_summary(source) -> str:
    """A damaged recording's losses in short sentences, told from its first sample ("" where none):
    a replay says them in turn on its top line."""
    first, end = getattr(source, "t_start", None), getattr(source, "t_end", None)
    if first is None or end is None:
        return ""
    salvaged = getattr(source, "salvaged", False)
    skipped = getattr(source, "skipped_chunks", 0)
    lost = source.lost() if salvaged or skipped else []
    for a, b in reversed(lost):  # the last sample read, where the chunks at the end are lost
        if b >= end:
            end = a
    out = []
    if salvaged:
        out.append(f"It is cut short: nothing after {fmt_duration(end - first)}." if source.cut else "It is damaged.")
    lost = [(a, b) for a, b in lost if a < end]
    if lost:
        out.append("No samples from " + ", ".join(f"{fmt_duration(max(0.0, a - first))} to {fmt_duration(b - first)}"
                                                  for a, b in lost[:2]) + (" and more." if len(lost) > 2 else "."))
    if skipped:
        out.append(f"{skipped} damaged chunk(s) skipped.")
    return " ".join(out)


def _nothing_read(source, name: str) -> NoReturn:
    """No sample could be read: a report of "no findings" would pass a CI gate on a file that
    said nothing, so this is an error."""
    skipped = getattr(source, "skipped_chunks", 0)
    total = getattr(source, "chunk_total", skipped)
    cut = getattr(source, "cut", None)
    how = f" (cut short: {cut[0]:,} of the {cut[1]:,} bytes its header counts)" if cut else ""
    if skipped:
        why = getattr(source, "damage", None)
        raise TraintopError(f"{name}{how}: none of its {total} chunk(s) could be read ({why or 'all damaged'}); "
                            "nothing to analyze")
    if getattr(source, "salvaged", False):
        raise TraintopError(f"{name} is damaged{how}: no sample in it could be read; nothing to analyze")
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
    alerts = source.alerts()  # those still active when the recording ended end at its last sample (_report)
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
    from traintop.record.recording import RecordingReader

    reader = RecordingReader(path)
    try:
        return _summarise(reader, names, ids)
    finally:
        reader.close()


def _summarise(source, names: dict, ids: list[int]):
    """Per-GPU accumulators over the chunks ``ids`` (in time order), from their columns only."""
    from traintop.record.codec import SCHEMES, gpu_column

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
            idle, clock = waste.idle_share, waste.clock_share
            acc.idle.extend([idle(None if v is None else v / u100) for v in u] if u else [nan] * len(times))
            sm, mx = col("sm_clock"), _last(col("sm_clock_max"))
            ratio = waste.clock_ratio
            acc.clock.extend([clock(ratio(v, mx)) for v in sm] if sm else [nan] * len(times))
            acc.power.extend([v / scale["power_w"] if v is not None else nan for v in pw] if pw else [nan] * len(times))
            en = col("energy_j")
            acc.energy.extend([v / scale["energy_j"] if v is not None else nan for v in en] if en else [nan] * len(times))
    return accs, first, last, n, getattr(source, "skipped_chunks", 0) - before, getattr(source, "damage", None)


def render_text(r: Report) -> str:
    out = [f"traintop analyze — {r.source} ({r.kind})",
           f"{fmt_duration(r.duration_s)}, {r.samples} samples every {r.interval_s:.2g} s, {len(r.gpus)} GPU(s), "
           f"{r.gpu_hours:.3f} GPU-hours, {'energy unknown' if r.energy_kwh is None else f'{r.energy_kwh:.3f} kWh'}; lost to findings: {r.gpu_hours_lost:.3f} GPU-hours"]
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
    explained = [(fd, by) for fd in r.findings if (by := fd.explained_by)]
    if not causes:
        out.append("No findings: nothing wasted GPU time that traintop recognises.")
    by_rule: dict[str, float] = {}
    for fd in r.findings:
        by_rule[fd.title] = by_rule.get(fd.title, 0.0) + fd.gpu_hours
    titles = {fd.rule: fd.title for fd in r.findings}
    for fd in causes:
        out.append("")
        start_s = r.at(fd.start)
        began = (f"from before the recording began ({fmt_duration(-start_s)} earlier)" if start_s < 0
                 else fmt_duration(start_s))
        out.append(f"[{fd.severity.label.upper()}] {fd.title} — {fd.subject.replace('gpu', 'GPU ')}, "
                   f"{began} to {fmt_duration(r.at(ended(fd)))} ({fmt_duration(round(ended(fd) - fd.start, 1))}, "
                   f"from {fmt_clock(fd.start)})"
                   + (f", {fd.gpu_hours:.3f} GPU-hours lost" if fd.gpu_hours else "")
                   + (f", {fd.energy_kwh:.3f} kWh drawn" if fd.energy_kwh else ""))
        out.append(f"  {fd.evidence}")
        for rem in fd.remedies:
            out.append(f"  → {rem}")
    if explained:
        out.append("")
        out.append("Explained by a stronger finding (not causes of their own; their GPU-hours are counted there):")
        for fd, by in explained:
            rule, _, subject = by.partition(" ")
            out.append(f"  {fd.title} — {fd.subject.replace('gpu', 'GPU ')}, {fmt_duration(r.at(fd.start))} to "
                       f"{fmt_duration(r.at(ended(fd)))}: explained by {titles.get(rule, rule)} "
                       f"({subject.replace('gpu', 'GPU ')})")
    if any(by_rule.values()):
        out.append("")
        out.append("GPU-hours lost by finding: " + "; ".join(f"{k} {v:.3f}" for k, v in by_rule.items() if v))
    if r.ledger:
        out.append("")
        out.append("Where each rank's time went (the probe's time ledger; goodput = the share in training steps):")
        out.extend(render_ledger(r.ledger))
    if r.captures:
        out.append("")
        out.append("Evidence captured when findings started:")
        out.extend(f"  at {fmt_duration(c['t_s'])}, {c['line']}" for c in r.captures)
    if r.stacks:
        out.append("")
        out.append("Where the job's threads were (the probes' stack dumps, innermost call last):")
        for d in r.stacks:
            since = f", {fmt_duration(d['since_step_s'])} after its last step" if d["since_step_s"] is not None else ""
            why = why_taken(d["reason"])
            who = d["label"] if d["rank"] is None else f"{d['label']} (PID {d['pid']})"  # never "PID 7 (PID 7)"
            out.append(f"  {who} at {fmt_duration(d['t_s'])}, {why}{since}:")
            for th in d["threads"]:
                out.append(f"    {th['name']}{' (main)' if th['main'] else ''}:")
                out.extend(f"      {line}" for line in th["innermost"])
    # names, alert texts and notes come from the file: nothing in them may act on a terminal
    return plain("\n".join(out))


def render_json(r: Report) -> str:
    return json.dumps(r.to_dict(), indent=1)
