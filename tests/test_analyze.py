"""`traintop analyze` trusts a recording's own alerts only when the same rules judged it."""

import dataclasses
import json

from traintop import cli
from traintop.reports.analyze import analyze
from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingReader, RecordingWriter
from traintop.rules import Severity, Thresholds


def record(path, scenario="starved,healthy", seconds=240, config=None):
    from traintop.rules import default_engine

    sim = Simulator(scenario, gpus=2, interval=0.5, seed=4)
    clock = [0.0]
    mon = Monitor(sim.info(), engine=default_engine(config) if config else None,
                  recorder=RecordingWriter(str(path), sim.info(), clock=lambda: clock[0]))
    for f in sim.frames(int(seconds / 0.5)):
        clock[0] = f.t
        mon.ingest(f)
    mon.close()


def test_recorded_alerts_and_columnar_summary_match_a_full_rerun(tmp_path):
    path = tmp_path / "s.ttrec"
    record(path)
    reader = RecordingReader(str(path))
    assert reader.judged_by(None)
    fast = analyze(reader, name="s")
    slow = analyze(RecordingReader(str(path)), name="s", rerun=True)
    assert "while recording" in " ".join(fast.notes) and not any("while recording" in n for n in slow.notes)
    assert [(f.rule, f.subject, fast.at(f.start), fast.at(f.end)) for f in fast.findings] == \
        [(f.rule, f.subject, slow.at(f.start), slow.at(f.end)) for f in slow.findings]
    assert {f.rule for f in fast.findings} >= {"starvation", "power_cap"}
    for a, b in zip(fast.gpus, slow.gpus):
        for field in dataclasses.fields(a):
            va, vb = getattr(a, field.name), getattr(b, field.name)
            assert va == vb if not isinstance(va, float) else abs(va - vb) < 1e-6, (field.name, va, vb)
    assert abs(fast.gpu_hours_lost - slow.gpu_hours_lost) < 1e-3 and fast.gpu_hours_lost > 0
    assert (fast.samples, fast.duration_s) == (slow.samples, slow.duration_s)


def test_other_thresholds_or_rules_mean_a_rerun(tmp_path, capsys):
    path = tmp_path / "s.ttrec"
    record(path)
    strict = Thresholds().with_overrides(starvation_window_s=2000)  # needs 1000 s of data: none here
    reader = RecordingReader(str(path))
    assert not reader.judged_by(strict)
    report = analyze(reader, config=strict)
    assert "starvation" not in {f.rule for f in report.findings}  # judged again, by the stricter rule
    # a file recorded by an older rules version is judged again too
    other = tmp_path / "old.ttrec"
    record(other, seconds=60)
    import sqlite3  # rewrite the metadata as an older rules version would have
    db = sqlite3.connect(str(other))
    db.execute("UPDATE meta SET value = ? WHERE key = 'rules'", (json.dumps({"version": 1, "thresholds": {}}),))
    db.commit()
    db.close()
    assert not RecordingReader(str(other)).judged_by(None)
    assert cli.main(["analyze", str(path), "--rerun"]) == 0
    assert "while recording" not in capsys.readouterr().out


def test_seek_takes_up_the_recorded_alerts(tmp_path):
    from traintop.watch import sessions

    path = tmp_path / "s.ttrec"
    record(path, scenario="starved,healthy", seconds=300)
    monitor, feed = sessions.replay_session(str(path))
    assert feed._recorded_alerts is not None
    target = feed.t_start + 200
    feed.seek(target)
    restored = {(a.rule, a.subject) for a in monitor.engine.active}
    # the same as playing the whole file up to the target with the rules running
    full_mon, full_feed = sessions.replay_session(str(path))
    full_feed._recorded_alerts = None
    full_feed.seek(full_feed.t_start)
    full_feed._emit_until(target)
    assert restored == {(a.rule, a.subject) for a in full_mon.engine.active}
    assert ("starvation", "gpu0") in restored
    assert len(monitor.store) <= 241  # only what the windows and sparklines need (120 s at 2 Hz)
    # and the replay goes on from there: the alert is still judged by the rules
    feed._emit_until(target + 30)
    assert ("starvation", "gpu0") in {(a.rule, a.subject) for a in monitor.engine.active}


def test_a_long_recording_is_summarised_by_several_processes_with_the_same_result(tmp_path, monkeypatch):
    import traintop.reports.analyze as an

    path = tmp_path / "s.ttrec"
    record(path, seconds=600)  # small chunks of a second each until they merge: many chunk ids
    alone = analyze(RecordingReader(str(path)))
    monkeypatch.setattr(an, "PARALLEL_MIN_CHUNKS", 1)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    calls = []
    real = an._summarise_parallel
    monkeypatch.setattr(an, "_summarise_parallel", lambda *a: calls.append(1) or real(*a))
    shared = analyze(RecordingReader(str(path)))
    assert calls and shared.samples == alone.samples
    for a, b in zip(alone.gpus, shared.gpus):
        assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert [(f.rule, f.subject, f.gpu_hours) for f in alone.findings] == \
        [(f.rule, f.subject, f.gpu_hours) for f in shared.findings]


# -- a log shorter than the rules' windows is judged over its whole length (item 8 of the diagnosis issue)
def _dmon_log(path, seconds, sm, pwr):
    lines = ["#Date        Time         gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk",
             "#YYYYMMDD    HH:MM:SS     Idx      W      C      C      %      %      %      %      %      %    MHz    MHz"]
    for k in range(seconds):
        lines.append(f" 20261202    10:{k // 60:02d}:{k % 60:02d}       0   {pwr(k):4d}     38     42   {sm(k):4d}      1"
                     "      0      0      0      0   3201   1980")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _query_log(path, seconds, util, mem_mib):
    rows = ["timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W], power.limit [W]"]
    for k in range(seconds * 10):
        rows.append(f"2026/12/02 10:{k // 600:02d}:{(k // 10) % 60:02d}.{k % 10}00, 0, {util} %, {mem_mib} MiB, 143771 MiB, "
                    "80.50 W, 700.00 W")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_a_short_dmon_log_of_a_barely_used_gpu_is_judged_whole(tmp_path):
    """46 s at ~6 % and 117 W: shorter than the minute that underuse without a power limit asks for."""
    from traintop.reports.analyze import analyze
    from traintop.sources.importers import load

    path = _dmon_log(tmp_path / "d.txt", 46, sm=lambda k: 6 + (k % 3), pwr=lambda k: 117)
    r = analyze(load(path), name="d.txt")
    assert [f.rule for f in r.findings] == ["underuse"]
    assert any("judged the whole of it" in n for n in r.notes)


def test_a_short_log_of_a_gpu_held_idle_is_judged_whole(tmp_path):
    """49 s of a GPU holding 621 MB at 0 %."""
    from traintop.reports.analyze import analyze
    from traintop.sources.importers import load

    path = _query_log(tmp_path / "q.csv", 49, util=0, mem_mib=621)
    r = analyze(load(path), name="q.csv")
    assert [f.rule for f in r.findings] == ["idle_gpu"]


def test_a_short_log_of_a_healthy_busy_gpu_stays_quiet(tmp_path):
    from traintop.reports.analyze import analyze
    from traintop.sources.importers import load

    path = _dmon_log(tmp_path / "h.txt", 46, sm=lambda k: 99, pwr=lambda k: 690)
    assert [f.rule for f in analyze(load(path), name="h.txt").findings if f.severity > Severity.INFO] == []


def _long_h200_log(path, copies: int):
    """A real H200 log (its phases again and again, at 1 Hz), each copy five minutes on."""
    import gzip
    import pathlib

    src = pathlib.Path(__file__).parent / "fixtures" / "h200" / "smi-query-100ms.csv.gz"
    head, *rows = gzip.decompress(src.read_bytes()).decode().splitlines()
    out = [head]
    for k in range(copies):
        for r in rows[::10]:
            stamp, rest = r.split(",", 1)
            minute = int(stamp[14:16]) + 5 * k
            hour = int(stamp[11:13]) + minute // 60
            out.append(f"{stamp[:8]}{int(stamp[8:10]) + hour // 24:02d} {hour % 24:02d}:{minute % 60:02d}{stamp[16:]},{rest}")
    path.write_text("\n".join(out))
    return str(path)


def test_a_long_log_keeps_every_finding_not_the_last_500(tmp_path, monkeypatch):
    """About eleven hours of a log repeating one pattern: the report holds the findings of its
    first hour too, and counts their GPU-hours; past the stated limit it says that some were left out."""
    import traintop.reports.analyze as A
    from traintop.sources import importers

    p = _long_h200_log(tmp_path / "long.csv", 130)
    report = analyze(importers.load(p))
    assert len(report.findings) > 500 and report.findings[0].start - report.t0 < 600
    assert not any("left out" in n for n in report.notes)
    monkeypatch.setattr(A, "MAX_FINDINGS", 100)
    small = analyze(importers.load(p))
    assert any("left out" in n for n in small.notes) and small.gpu_hours_lost < report.gpu_hours_lost


def test_a_long_log_judged_in_parts_gives_what_one_run_gives(tmp_path, monkeypatch):
    """Eight hours of a real H200 log judged in four parts at once: the same findings, the same
    times and evidence, as one run over the whole."""
    import traintop.reports.analyze_parallel as P
    from traintop.sources import importers

    p = _long_h200_log(tmp_path / "long.csv", 96)
    monkeypatch.setattr(P, "workers_for", lambda span: 1)
    one = analyze(importers.load(p))
    monkeypatch.setattr(P, "workers_for", lambda span: 4)
    parts = analyze(importers.load(p))

    def key(r):
        return [(f.rule, f.subject, f.start, f.end, f.severity, f.evidence, f.explained_by, f.gpu_hours)
                for f in r.findings]
    assert len(one.findings) > 300
    assert key(parts) == key(one) and parts.gpu_hours_lost == one.gpu_hours_lost
