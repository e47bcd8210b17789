"""An alert's life: it ends quickly when its condition plainly reverses, slowly for noise; its
evidence follows the numbers while it is up, and it keeps its most informative sentence."""

import re

from traintop.watch import sessions
from traintop.reports.analyze import analyze
from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.rules.engine import SETTLE_S, HOLDS, LAPSED, REVERSED, Verdict, RulesEngine, informative
from traintop.samples import REASON_SW_POWER_CAP, Frame, GpuProcess, GpuSample, ProcessSample, ProcInfo, RankSample
from traintop.store import Store
from traintop.units import GiB


def run(frames, info=None):
    mon = Monitor(info or Simulator().info())
    for f in frames:
        mon.ingest(f)
    return mon


def _demo_creep():
    reader = sessions.open_source(sessions.demo_path())
    mon = Monitor(reader.info)
    freed_at = peak = None
    t0 = None
    for f in reader.frames():
        t0 = t0 if t0 is not None else f.t
        mon.ingest(f)
        alloc = f.ranks[0].allocated if f.ranks and f.ranks[0].allocated else None
        if alloc is not None and any(a.rule == "memory_creep" for a in mon.engine.alerts):
            peak = max(peak or 0, alloc)
            if freed_at is None and alloc < peak - 10 * GiB:
                freed_at = f.t
    return mon, freed_at


def test_creeping_memory_clears_within_seconds_once_the_memory_is_freed():
    mon, freed_at = _demo_creep()  # the demo's last phase: allocated 28 GiB -> 8 GiB
    creep = [a for a in mon.engine.alerts if a.rule == "memory_creep"]
    assert len(creep) == 1 and freed_at is not None
    assert creep[0].end is not None and creep[0].end - freed_at <= 3.0  # was 40 s and more
    assert "rising" in creep[0].evidence  # it keeps what it found, not the sentence that ended it


def test_analyze_reports_creeping_memory_ending_when_it_was_freed():
    reader = sessions.open_source(sessions.demo_path())
    report = analyze(reader, rerun=True)
    reader.close()
    creep = [f for f in report.findings if f.rule == "memory_creep"]
    # was 40 s and more; the rules judge once a second, so its start and end each move by up to one judgement
    assert len(creep) == 1 and round(creep[0].end - creep[0].start, 1) <= 21


def _rising_then_flat(t):
    used = int((20 + min(t, 60) * 0.3) * GiB)
    return Frame(t=float(t), gpus=(GpuSample(index=0, util=99.0, mem_used=used, mem_total=140 * GiB,
                                             power_w=600, power_limit_w=700, processes=(GpuProcess(10, used),)),))


def test_memory_that_stops_rising_ends_once_the_rise_is_gone_from_now():
    """A finding holds *now*: memory that stopped rising at 60 s ends when its recent slope is flat,
    not a minute later; the end is when it stopped holding."""
    mon = run([_rising_then_flat(t) for t in range(300)])
    (a,) = [a for a in mon.engine.alerts if a.rule == "memory_creep"]
    assert a.start < 60 and a.end is not None and 60 <= a.end <= 60 + 30
    assert "rising" in a.evidence


def _capped(t, util):
    return Frame(t=float(t), gpus=(GpuSample(index=0, util=util, power_w=6.1 * util, power_limit_w=700.0,
                                             reasons=REASON_SW_POWER_CAP),))


def test_a_load_that_falls_ends_the_power_cap_once_it_no_longer_holds_now():
    frames = [_capped(t, 99.0) for t in range(40)] + [_capped(t, 60.0) for t in range(40, 46)]
    mon = run(frames)
    (a,) = [a for a in mon.engine.alerts if a.rule == "power_cap"]
    assert a.active  # 60 % for a few seconds: it settles first (SETTLE_S)
    now = int(re.search(r"at (\d+) % utilization", a.evidence).group(1))
    assert 60 < now < 99  # the evidence follows the numbers meanwhile
    for f in [_capped(t, 60.0) for t in range(46, 52)]:
        mon.ingest(f)
    (a,) = [a for a in mon.engine.alerts if a.rule == "power_cap"]  # its record as it stands now
    assert a.end is not None and 40 <= a.end <= 46  # soon after it stopped holding (not once the window emptied)
    kept = int(re.search(r"at (\d+) % utilization", a.evidence).group(1))
    assert kept >= 85  # the recorded alert keeps a sentence from while its condition held


def test_a_load_that_is_gone_ends_the_power_cap_alert_at_once():
    frames = [_capped(t, 99.0) for t in range(40)] + [_capped(t, 5.0) for t in range(40, 52)]
    (a,) = [a for a in run(frames).engine.alerts if a.rule == "power_cap"]
    assert a.end is not None and a.end <= 46


def test_a_starvation_alert_gains_the_measured_wait_that_arrives_later():
    def frame(t):
        busy = (t % 16) < 6  # 10 Hz: ~1 s busy, 1 s idle
        wait = (RankSample(pid=10, rank=0, cuda=True, input_wait=0.7, steps=t),) if t >= 400 else ()
        workers = tuple(ProcInfo(20 + k, "pt_data_worker", 100.0, GiB, 1, True) for k in range(2))
        return Frame(t=t / 10, gpus=(GpuSample(index=0, util=100.0 if busy else 0.0, power_w=300, power_limit_w=700,
                                               processes=(GpuProcess(10, 10 * GiB),)),),
                     process=ProcessSample(pid=10, alive=True, name="python", cpu_percent=100.0,
                                           members=(ProcInfo(10, "python", 50.0, GiB, 4),) + workers),
                     ranks=wait)
    mon = run([frame(t) for t in range(700)])
    (a,) = [a for a in mon.engine.alerts if a.rule == "starvation"]
    assert a.start < 40 and "waits for its next batch 70 %" in a.evidence
    (a,) = [a for a in mon.engine.close_all(70.0) if a.rule == "starvation"]
    assert "waits for its next batch 70 %" in a.evidence  # the most informative sentence is kept


class _Scripted:
    """A rule that says what a test tells it to."""

    id, title, raise_after, clear_after, remedies = "scripted", "Scripted", 0.0, 30.0, ()
    from traintop.rules.engine import Severity
    severity = Severity.WARNING

    def __init__(self):
        self.say: list[Verdict] = []

    def evaluate(self, ctx):
        return self.say


def test_engine_states_reversed_ends_now_lapsed_settles_and_best_evidence_is_kept():
    rule = _Scripted()
    eng, store = RulesEngine([rule]), Store(capacity=10)
    rule.say = [Verdict("gpu0", "GPU 0 at 10 % for 20 s, 3 gaps")]
    eng.evaluate(store, 0.0)
    rule.say = [Verdict("gpu0", "GPU 0 at 12 %", state=HOLDS)]
    eng.evaluate(store, 1.0)
    (a,) = eng.alerts
    assert a.evidence == "GPU 0 at 12 %"  # the live sentence
    rule.say = [Verdict("gpu0", "GPU 0 at 55 % now", state=LAPSED)]
    eng.evaluate(store, 2.0)
    (a,) = eng.alerts  # a change is a new record
    assert a.active and a.evidence == "GPU 0 at 55 % now"  # lapsed: it settles, the evidence follows
    eng.evaluate(store, 2.0 + SETTLE_S)
    (a,) = eng.alerts
    assert a.end == 2.0 and a.evidence == "GPU 0 at 10 % for 20 s, 3 gaps"  # ended when it stopped; most figures
    assert informative(a.evidence) == 4
    rule.say = [Verdict("gpu0", "GPU 0 at 10 % for 30 s, 4 gaps")]
    for t in (20.0, 21.0):
        eng.evaluate(store, t)
    b = eng.alerts[-1]
    assert b.id != a.id and b.active
    rule.say = [Verdict("gpu0", "GPU 0 at 99 %", state=REVERSED)]
    eng.evaluate(store, 22.0)
    b = eng.alerts[-1]
    assert b.end == 22.0  # plainly reversed: at once


def test_alert_changes_count_starts_and_ends_not_evidence_that_moves():
    """The dashboard draws at once when alert_changes moves, past its redraw cap: a finding's
    evidence quotes live figures and changes nearly every second, which must not count."""
    sim = Simulator("starved", gpus=1, interval=0.5, seed=3)
    mon = Monitor(sim.info())
    for _ in range(400):
        mon.ingest(sim.next_frame())
        if mon.engine.active:
            break
    assert mon.engine.active, "the simulated loader never raised a finding"
    counted, evidence_only = mon.alert_changes, 0
    shown = {(a.id, a.severity) for a in mon.engine.active}
    for _ in range(60):
        changed = mon.ingest(sim.next_frame())
        now = {(a.id, a.severity) for a in mon.engine.active}
        if now != shown:
            counted, shown = counted + 1, now
        elif changed:
            evidence_only += 1
        assert mon.alert_changes == counted
    assert evidence_only > 0  # the moving evidence really happened, and did not count


def _spinning(t):
    """A kernel spinning in a hang: "utilization" 100 %, SMs idle, power near idle."""
    return Frame(t=float(t), gpus=(GpuSample(index=0, util=100.0, sm_active=1.0, power_w=125.0, power_limit_w=700.0,
                                             reasons=REASON_SW_POWER_CAP if t < 44 else 0),))


def test_a_gpu_spinning_in_a_hang_is_not_called_power_capped_at_full_load():
    # capped at full load for 13 s (not yet the 10 s held over a full window), then a hang: the
    # window still counts the capped seconds, but the GPU is no longer loaded
    loaded = [Frame(t=float(t), gpus=(GpuSample(index=0, util=99.0, sm_active=92.0, power_w=695.0,
                                                power_limit_w=700.0, reasons=REASON_SW_POWER_CAP),))
              for t in range(30, 43)]
    mon = run(loaded + [_spinning(t) for t in range(43, 90)])
    assert not [a for a in mon.engine.alerts if a.rule == "power_cap" and (a.end is None or a.end > 48)]


def test_a_power_cap_alert_ends_once_its_gpu_spins_instead_of_working():
    frames = [_capped(t, 99.0) for t in range(40)] + [_spinning(t) for t in range(40, 60)]
    (a,) = [a for a in run(frames).engine.alerts if a.rule == "power_cap"]
    assert a.end is not None and a.end <= 46


def test_the_h200_ddp_stall_raises_no_power_cap_alert_while_its_gpus_spin():
    """Recorded on an H200: the job hangs in a collective at ~35 s (SMs 1 %, 125 W, utilization
    100 %); the 20-s window then still held capped full-load seconds."""
    import os

    from traintop.record.recording import RecordingReader

    path = os.path.join(os.path.dirname(__file__), "fixtures", "h200", "ddp-stall-10hz.ttrec")
    report = analyze(RecordingReader(path), rerun=True)  # the rules now, not the alerts it recorded
    assert not [f for f in report.findings if f.rule == "power_cap"]


def test_on_an_h200_the_power_cap_alert_ends_within_seconds_of_a_spinning_kernel():
    """Recorded on an H200 (scripts/h200_power_cap.sh): bf16 matmuls at the power limit, then a
    kernel spinning (utilization 100 %, SMs 1 %, 122 W), then idle. The rules run again over it."""
    import os

    from traintop.reports.analyze import analyze

    from traintop.record.recording import RecordingReader

    path = os.path.join(os.path.dirname(__file__), "fixtures", "h200", "power-cap-then-spin.ttrec")
    reader = RecordingReader(path)
    spin = next(f.t for f in reader.frames() if f.gpus[0].sm_active is not None and f.gpus[0].sm_active < 20
                and f.gpus[0].util >= 99) - reader.t_start
    report = analyze(RecordingReader(path), rerun=True)
    (cap,) = [f for f in report.findings if f.rule == "power_cap"]
    start_s, end_s = report.at(cap.start), report.at(cap.end)
    assert start_s < spin - 10  # raised during the real full load
    assert end_s <= spin + 5, (end_s - spin)  # and ended within seconds of the spin


# -- a finding's start is one value everywhere ------------------------------------------------
def _record_as_live(path, scenario="starved", seconds=120.0):
    """A session sampled as live sampling does: times off the millisecond a recording keeps, each
    sample a fraction of a millisecond early or late (the rules' judgement once a second then falls
    on either side of a sample). Returns its findings as the session ended them (what `traintop run
    --no-ui` sums up)."""
    import dataclasses
    import random

    sim = Simulator(scenario, seed=3, t0=1_790_000_000.1234567)
    jitter = random.Random(1)
    monitor = Monitor(sim.info())
    monitor.start_recording(path)
    for _ in range(int(seconds / sim.interval)):
        f = sim.next_frame()
        monitor.ingest(dataclasses.replace(f, t=f.t + jitter.uniform(-0.0004, 0.0004)))
    monitor.close()
    return monitor.engine.alerts


def _replayed_start(path, rule, seek_to=None):
    """In the dashboard replaying ``path`` (from its start, or from a seek to ``seek_to`` seconds in,
    then stepping on): the start of ``rule``'s finding once it is up, as the engine holds it and as
    the alerts panel says it ("since HH:MM:SS")."""
    import asyncio

    from traintop.app.factory import build_app

    async def go():
        monitor, feed = sessions.replay_session(path)
        feed.playing = False
        if seek_to is not None:
            feed.seek(feed.t_start + seek_to)
        app = build_app(monitor, feed, mode="replay", start_feed=False)
        async with app.run_test(size=(160, 48)) as pilot:
            while not any(a.rule == rule for a in monitor.engine.active) and feed.peek() is not None:
                feed.step(1)
            app.refresh_view()
            await pilot.pause()
            (up,) = [a for a in monitor.engine.active if a.rule == rule]
            return up.start, str(app.query_one("#alerts-body").render())

    return asyncio.run(go())


def test_a_findings_start_is_the_same_in_the_summary_analyze_its_rerun_and_the_replay(tmp_path):
    """The --no-ui summary, analyze, analyze --rerun and the replay (played from the start, and after
    seeks before, into and after the finding's start) gave up to five different start times: the
    rules judged once a second counted from the first sample they saw (sub-millisecond jitter and a
    replay that starts or seeks elsewhere moved every later judgement), and a replay after a seek
    judged a finding again from the seek on."""
    from traintop.reports.analyze import render_text
    from traintop.cli import findings_summary
    from traintop.record.recording import RecordingReader
    from traintop.units import fmt_clock

    path = str(tmp_path / "live.ttrec")
    live = [a for a in _record_as_live(path) if a.rule == "starvation"]
    assert len(live) == 1
    start = live[0].start
    clock = fmt_clock(start)
    summary = "\n".join(findings_summary(live))
    assert f"from {clock}" in summary

    reader = RecordingReader(path)
    t0 = reader.t_start
    assert [a.start for a in reader.alerts() if a.rule == "starvation"] == [start]
    for rerun in (False, True):
        report = analyze(RecordingReader(path), rerun=rerun)
        assert [f.start for f in report.findings if f.rule == "starvation"] == [start], rerun
        assert f"from {clock})" in render_text(report)

    # played from the start; after seeks before it (the rules' raise delay still to run), just after
    # it and well past it
    for seek_to in (None, start - t0 - 4.0, start - t0 + 1.0, 90.0):
        shown, panel = _replayed_start(path, "starvation", seek_to)
        assert shown == start, seek_to
        assert f"since {clock}" in panel, seek_to
