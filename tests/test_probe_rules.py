"""Rules that need the probe: input wait, allocated creep, fragmentation, CPU training, step regression."""

import dataclasses
import re

from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.rules import Severity
from traintop.samples import Frame, GpuProcess, GpuSample, HostSample, ProcessSample, ProcInfo, RankSample, SessionInfo
from traintop.units import GiB, MiB


def run(frames, info=None):
    mon = Monitor(info or Simulator().info())
    for f in frames:
        mon.ingest(f)
    return mon


def job(t, cpu=150.0):
    return ProcessSample(pid=10, alive=True, name="python", cpu_percent=cpu,
                         members=(ProcInfo(10, "python", cpu, GiB, 10),))


def gpu(used=40 * GiB, util=100.0, pid=10):
    return (GpuSample(index=0, util=util, mem_used=used, mem_total=140 * GiB, power_w=600, power_limit_w=700,
                      processes=(GpuProcess(pid, used),) if pid else ()),)


def test_measured_input_wait_is_starvation_even_when_utilization_looks_busy():
    frames = [Frame(t=float(t), gpus=gpu(util=95.0), process=job(t),
                    ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=30 * GiB, reserved=35 * GiB,
                                      input_wait=0.55, steps=t, step_time=0.2),))
              for t in range(60)]
    mon = run(frames)
    a = next(a for a in mon.engine.alerts if a.rule == "starvation")
    assert "waits for its next batch 55 %" in a.evidence


def test_allocated_creep_is_read_from_the_probe():
    frames = [Frame(t=float(t), gpus=gpu(used=40 * GiB), process=job(t),
                    ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=int(5 * GiB + t * 0.3 * GiB),
                                      reserved=38 * GiB),)) for t in range(90)]
    mon = run(frames)  # NVML's figure is flat: the cache hides the leak from it
    a = next(a for a in mon.engine.alerts if a.rule == "memory_creep")
    assert "rank 0's allocated memory rising 0.30 GiB/s" in a.evidence


def test_a_slow_leak_under_swinging_steps_is_named():
    """16 MiB/s kept on an H200-sized card (2 % of it takes three minutes), with every step's
    activations swinging 2 GiB above the floor: named from its floor's rise over minutes, with the
    time to full, and never on the swings of a steady job."""
    def frame(t, leak):
        swing = 2 * GiB if int(t * 2) % 2 else 0
        floor = 5 * GiB + (int(max(0.0, t - 60) * 16 * MiB) if leak else 0)
        return Frame(t=t, gpus=gpu(used=60 * GiB), process=job(t),
                     ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=floor + swing, reserved=50 * GiB,
                                       steps=int(t * 10)),))
    times = [k * 0.5 for k in range(2 * 420)]
    creep = [a for a in run([frame(t, True) for t in times]).engine.alerts if a.rule == "memory_creep"]
    assert creep and "rising 16 MiB/s" in creep[0].evidence and "full in" in creep[0].evidence, creep
    assert creep[0].start < 60 + 300  # within five minutes of its start: 4.7 GiB by then
    assert not [a for a in run([frame(t, False) for t in times]).engine.alerts if a.rule == "memory_creep"]


def test_fragmentation_needs_split_blocks_and_leaves_retries_to_the_oom_finding():
    """A cache far above what is allocated is no fragmentation by itself; split blocks among live
    tensors are; once allocations retry, the out-of-memory finding says it (with the split blocks)."""
    def frame(t, retries, split=0):
        return Frame(t=float(t), gpus=gpu(), process=job(t),
                     ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=20 * GiB, reserved=60 * GiB,
                                       inactive_split=split, alloc_retries=retries, ooms=0),))
    assert not [a for a in run([frame(t, 0) for t in range(60)]).engine.alerts if a.rule == "fragmentation"]
    (a,) = [a for a in run([frame(t, 0, split=30 * GiB) for t in range(60)]).engine.alerts
            if a.rule == "fragmentation"]
    assert "30.0 GiB of it (50 %) in split blocks" in a.evidence
    # retries are the out-of-memory finding (a warning); fragmentation does not say them again
    mon = run([frame(t, t // 5, split=30 * GiB) for t in range(60)])
    assert not [a for a in mon.engine.alerts if a.rule == "fragmentation"]
    a = next(a for a in mon.engine.alerts if a.rule == "oom")
    assert a.severity == Severity.WARNING and "allocation retries" in a.evidence and "reserves 60.0 GiB" in a.evidence


def test_out_of_memory_errors_the_job_survived_are_critical_and_stay_said():
    """A caught OutOfMemoryError: num_ooms rises once; the finding stays up while it is recent."""
    def frame(t):
        return Frame(t=float(t), gpus=gpu(), process=job(t),
                     ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=10 * GiB, reserved=12 * GiB, peak=14 * GiB,
                                       alloc_retries=3 if t >= 20 else 0, ooms=1 if t >= 21 else 0),))
    mon = run([frame(t) for t in range(90)])
    a = next(a for a in mon.engine.alerts if a.rule == "oom")
    assert a.severity == Severity.CRITICAL and a.start <= 23 and a.end is None
    assert "1 allocation failed (out of memory) and 3 allocation retries" in a.evidence
    assert any("smaller batch" in r for r in a.remedies)


def test_split_blocks_are_fragmentation_info_until_memory_is_tight():
    def frame(t, used):
        return Frame(t=float(t), gpus=gpu(used=used), process=job(t),
                     ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=16 * GiB, reserved=32 * GiB,
                                       inactive_split=15 * GiB, alloc_retries=0, ooms=0),))
    a = next(a for a in run([frame(t, 33 * GiB) for t in range(60)]).engine.alerts if a.rule == "fragmentation")
    assert a.severity == Severity.INFO and "15.0 GiB of it (47 %) in split blocks" in a.evidence
    a = next(a for a in run([frame(t, 130 * GiB) for t in range(60)]).engine.alerts if a.rule == "fragmentation")
    assert a.severity == Severity.WARNING and "nearly full" in a.evidence


def test_training_on_the_cpu():
    frames = [Frame(t=float(t), gpus=gpu(util=0.0, pid=None), process=job(t, cpu=390.0),
                    ranks=(RankSample(pid=10, cuda=False, steps=t * 3),)) for t in range(60)]
    a = next(a for a in run(frames).engine.alerts if a.rule == "cpu_training")
    assert "no CUDA use" in a.evidence
    on_gpu = [Frame(t=float(t), gpus=gpu(), process=job(t, cpu=390.0)) for t in range(60)]
    assert not [a for a in run(on_gpu).engine.alerts if a.rule == "cpu_training"]


def test_training_on_the_cpu_by_the_probes_word_whatever_the_cpu_share():
    """A busy host gives the job 66-80 % of a core: the probe's steps without CUDA still decide."""
    frames = [Frame(t=float(t), gpus=gpu(util=0.0, pid=None), process=job(t, cpu=66.0 + (t % 15)),
                    ranks=(RankSample(pid=10, cuda=False, steps=t * 2),)) for t in range(60)]
    a = next(a for a in run(frames).engine.alerts if a.rule == "cpu_training")
    assert "optimizer steps" in a.evidence and "no CUDA" in a.evidence
    idle = [Frame(t=float(t), gpus=gpu(util=0.0, pid=None), process=job(t, cpu=70.0),
                  ranks=(RankSample(pid=10, cuda=False, steps=5),)) for t in range(60)]
    assert not [a for a in run(idle).engine.alerts if a.rule == "cpu_training"]  # not stepping: not training


def test_training_on_the_cpu_counts_its_steps_over_the_seconds_there_are():
    """Watched for 20 s (or a replay 20 s in), 2 steps a second: 38 steps over those 19 s, not "in the
    last 30 s", the rule's window, which would read as a job five times slower than it is."""
    frames = [Frame(t=float(t), gpus=gpu(util=0.0, pid=None), process=job(t, cpu=90.0),
                    ranks=(RankSample(pid=10, cuda=False, steps=t * 2),)) for t in range(20)]
    a = next(a for a in run(frames).engine.alerts if a.rule == "cpu_training")
    assert "took 38 optimizer steps in the last 19 s" in a.evidence, a.evidence
    later = [Frame(t=float(t), gpus=gpu(util=0.0, pid=None), process=job(t, cpu=90.0),
                   ranks=(RankSample(pid=10, cuda=False, steps=t * 2),)) for t in range(60)]
    a = next(a for a in run(later).engine.alerts if a.rule == "cpu_training")
    assert "took 60 optimizer steps in the last 30 s" in a.evidence, a.evidence


def _paced(step_s, t_end: float, dt: float = 0.1):
    """Frames of a job whose steps take ``step_s(t)`` seconds, as the probe reports it: the step count
    (what the rule reads) and the last step's time."""
    frames, steps = [], 0.0
    for k in range(int(t_end / dt)):
        t = k * dt
        steps += dt / step_s(t)
        frames.append(Frame(t=t, gpus=gpu(), process=job(t),
                            ranks=(RankSample(pid=10, rank=0, cuda=True, step_time=step_s(t), steps=int(steps)),)))
    return frames


def test_step_time_regression():
    a = next(a for a in run(_paced(lambda t: 0.1 if t < 200 else 0.18, 260)).engine.alerts
             if a.rule == "step_regression")
    assert "1.8×" in a.evidence


def test_slower_steps_are_said_while_they_are_slow_with_the_numbers_of_then():
    """A 30-s starvation makes 31-ms steps take 643 ms, then the job is fed again: the finding is up
    while the steps are slow, quotes them, and ends within seconds of their recovery (it stayed up
    40-65 s into healthy training, quoting a median of the two, "64 ms, 1.5x the 41 ms before")."""
    slow = range(150, 180)
    mon = run(_paced(lambda t: 0.643 if slow.start <= t < slow.stop else 0.031, 270))
    (a,) = [a for a in mon.engine.alerts if a.rule == "step_regression"]
    assert slow.start < a.start < slow.stop, a
    assert a.end is not None and a.end <= slow.stop + 6, a
    assert re.search(r"take 6[0-9][0-9] ms now", a.evidence) and "the 31 ms before" in a.evidence, a.evidence


def test_slower_steps_of_an_asynchronous_loop_are_read_from_its_step_count():
    """A compiled loop that synchronises every 10th step: the CPU's time for a step is its launch
    time (3 ms) but for every 10th, which waits for the GPU. Its pace (20 ms a step, then 46 ms while
    another job shares the GPU) is in its step count, not in the median of those times; and a 4-s
    checkpoint between steps is a pause, not a slower step."""
    frames, steps = [], 0
    for k in range(3000):
        t = k * 0.1
        pace = 0.046 if 200 <= t < 250 else 0.020
        paused = 120 <= t < 124
        if not paused:
            steps += round(0.1 / pace) if k % 2 else int(0.1 / pace)
        frames.append(Frame(t=t, gpus=gpu(), process=job(t),
                            ranks=(RankSample(pid=10, rank=0, cuda=True, step_time=0.003, steps=steps),)))
    found = [a for a in run(frames).engine.alerts if a.rule == "step_regression"]
    assert len(found) == 1 and 200 < found[0].start < 230, found
    assert "2." in found[0].evidence.split("×")[0][-4:], found[0].evidence  # 2.0-2.4x the 20 ms before


def _scaled(t_end, skipping, every=1.0):
    """10 steps a second; from ``skipping`` on, ``every`` share of them skipped by the GradScaler."""
    frames, steps, skipped = [], 0, 0.0
    for t in range(t_end):
        steps += 10
        if t in skipping:
            skipped += 10 * every
        frames.append(Frame(t=float(t), gpus=gpu(), process=job(t),
                            ranks=(RankSample(pid=10, rank=0, cuda=True, step_time=0.1, steps=steps,
                                              skipped_steps=int(skipped)),)))
    return frames


def test_skipped_optimizer_steps_are_said_while_the_scaler_skips_and_end_when_it_steps_again():
    """fp16 overflow: 40 s in which the GradScaler skips every step, the GPU busy and the loop going
    on (no stall, no pause): critical, raised within seconds, ended within seconds of the fix."""
    bad = range(60, 100)
    frames = _scaled(160, bad)
    mon = run(frames[:99])
    (a,) = [a for a in mon.engine.alerts if a.rule == "skipped_steps"]
    assert bad.start < a.start <= bad.start + 15, a
    assert a.severity is Severity.CRITICAL and "skipped every one of its last 300" in a.evidence, a.evidence
    for f in frames[99:]:
        mon.ingest(f)
    (a,) = [a for a in mon.engine.alerts if a.rule == "skipped_steps"]
    assert a.end is not None and a.end <= bad.stop + 20, a
    assert not {x.rule for x in mon.engine.alerts} & {"stall", "pause", "idle_gpu"}


def test_a_scaler_finding_its_scale_is_no_finding_and_a_share_of_skips_is_a_warning():
    """A skip now and then (the scaler growing its scale every 2000 steps) is how fp16 training
    works; a third of the steps skipped for a minute is a warning with its count."""
    assert "skipped_steps" not in _ids(_scaled(200, range(0, 200), every=0.05))
    mon = run(_scaled(160, range(60, 120), every=0.33))
    (a,) = [a for a in mon.engine.alerts if a.rule == "skipped_steps"]
    assert a.severity is Severity.WARNING and "those steps updated nothing" in a.evidence, a.evidence
    assert "skipped_steps" not in _ids(_scaled(160, ()))  # no scaler: never



def test_the_scale_search_at_a_jobs_start_is_no_finding():
    """A healthy fp16 job at 1 step a second skips its first 12 steps while the scaler halves its
    scale from 65536 (a warning for 2-6 s when 3 skips were enough)."""
    frames, skipped = [], 0
    for t in range(120):
        skipped += t < 12
        frames.append(Frame(t=float(t), gpus=gpu(), process=job(t),
                            ranks=(RankSample(pid=10, rank=0, cuda=True, step_time=1.0, steps=t + 1,
                                              skipped_steps=skipped),)))
    assert "skipped_steps" not in _ids(frames)


def test_simulated_probe_round_trips_through_a_recording(tmp_rec):
    from traintop.record.codec import roundtrip

    frames = Simulator("starved,memory_creep", gpus=2, interval=0.5).frames(20)
    back = roundtrip(frames)
    r0, b0 = frames[-1].ranks[0], back[-1].ranks[0]
    assert (b0.pid, b0.rank, b0.world_size, b0.cuda, b0.steps) == (r0.pid, r0.rank, r0.world_size, r0.cuda, r0.steps)
    assert abs(b0.allocated - r0.allocated) < 2**20 and abs(b0.input_wait - r0.input_wait) < 1e-3
    assert abs(b0.step_time - r0.step_time) <= 0.5e-4  # stored to 0.1 ms


def _ids(frames):
    return {a.rule for a in run(frames).engine.alerts}


def test_another_process_holding_gpu_memory():
    from traintop.samples import GpuProcess

    def frame(t):
        g = GpuSample(index=0, util=90.0, mem_used=60 * GiB, mem_total=140 * GiB, power_w=500, power_limit_w=700,
                      processes=(GpuProcess(10, 40 * GiB), GpuProcess(999, 16 * GiB)))
        return Frame(t=float(t), gpus=(g,), process=job(t))
    assert "other_process" in _ids([frame(t) for t in range(40)])


def test_another_process_computing_beside_the_job_with_little_memory():
    """NVML's per-process share: a small process busy 60 % of the GPU's time shares it with the job."""
    from traintop.samples import GpuProcess

    def frame(t, sm):
        g = GpuSample(index=0, util=90.0, mem_used=41 * GiB, mem_total=140 * GiB, power_w=500, power_limit_w=700,
                      processes=(GpuProcess(10, 40 * GiB, 30.0), GpuProcess(999, 256 * 2**20, sm)))
        return Frame(t=float(t), gpus=(g,), process=job(t))
    busy = [a for a in run([frame(t, 60.0) for t in range(40)]).engine.alerts if a.rule == "other_process"]
    assert busy and "PID 999 (256 MiB, busy 60 % of the time)" in busy[0].evidence
    assert "other_process" not in _ids([frame(t, 5.0) for t in range(40)])  # small and nearly idle: no concern


def test_host_memory_pressure():
    from traintop.samples import HostSample

    frames = [Frame(t=float(t), gpus=gpu(), process=job(t),
                    host=HostSample(cpu_percent=20.0, mem_used=int(125 * GiB), mem_total=128 * GiB, swap_used=0))
              for t in range(40)]
    assert "host_memory" in _ids(frames)


def test_host_memory_pressure_ends_when_the_ram_is_freed():
    """RAM filled to 97 %, then freed (as a job that loaded a dataset into RAM and let it go): the
    finding ends at the first sample after, not clear_after later; a dip to 92 % (still near the
    threshold) is noise and waits."""
    from traintop.samples import HostSample

    def frame(t, used_gib):
        return Frame(t=float(t), gpus=gpu(), process=job(t),
                     host=HostSample(cpu_percent=20.0, mem_used=int(used_gib * GiB), mem_total=128 * GiB, swap_used=0))
    frames = [frame(t, 124.5) for t in range(30)] + [frame(t, 3.0) for t in range(30, 60)]
    [alert] = [a for a in run(frames).engine.alerts if a.rule == "host_memory"]
    assert alert.end is not None and alert.end <= 31.0, alert.end
    dip = [frame(t, 124.5) for t in range(30)] + [frame(t, 118.0) for t in range(30, 40)]
    [alert] = [a for a in run(dip).engine.alerts if a.rule == "host_memory"]
    assert alert.end is None  # 92 %: within the margin, the usual clear delay


def test_imbalance_between_gpus():
    from traintop.samples import GpuProcess

    def frame(t):
        a = GpuSample(index=0, util=95.0, power_w=600, power_limit_w=700, processes=(GpuProcess(10, GiB),))
        b = GpuSample(index=1, util=40.0, power_w=300, power_limit_w=700, processes=(GpuProcess(11, GiB),))
        ddp = dataclasses.replace(job(t), members=(ProcInfo(10, "python", 100.0, GiB, 10),
                                                   ProcInfo(11, "python", 100.0, GiB, 10)))  # rank 1 is PID 11
        return Frame(t=float(t), gpus=(a, b), process=ddp)
    assert "imbalance" in _ids([frame(t) for t in range(80)])


def test_clocks_below_max_only_without_a_reason():
    def frame(t, reasons):
        g = GpuSample(index=0, util=99.0, sm_clock=1100, sm_clock_max=1980, reasons=reasons, power_w=400,
                      power_limit_w=700, mem_used=10 * GiB, mem_total=140 * GiB, processes=())
        return Frame(t=float(t), gpus=(g,))
    assert "low_clocks" in _ids([frame(t, 0) for t in range(60)])
    assert "low_clocks" not in _ids([frame(t, 0x4) for t in range(60)])  # the power cap explains it


def test_another_jobs_gpu_is_neither_other_process_nor_imbalance():
    """Seen on two H200s: a job on GPU 0 and an unrelated training run on GPU 1 gave "another
    process holds GPU memory" on GPU 1 and "GPUs busy unequally" across the two jobs."""
    from traintop.samples import GpuInfo, SessionInfo

    def frame(t):
        ours = GpuSample(index=0, util=(100.0 if t % 3 else 0.0), mem_used=14 * GiB, mem_total=140 * GiB,
                         power_w=400, power_limit_w=700, processes=(GpuProcess(10, 14 * GiB),))
        theirs = GpuSample(index=1, util=100.0, mem_used=14 * GiB, mem_total=140 * GiB, power_w=690,
                           power_limit_w=700, processes=(GpuProcess(999, 14 * GiB),))
        return Frame(t=float(t), gpus=(ours, theirs), process=job(t))
    info = SessionInfo(kind="live", gpus=(GpuInfo(index=0, name="H200"), GpuInfo(index=1, name="H200")))
    ids = {a.rule for a in run([frame(t) for t in range(90)], info).engine.alerts}
    assert "other_process" not in ids and "imbalance" not in ids


def test_a_starvation_alert_ends_within_seconds_once_the_measured_wait_drops():
    # 2 Hz; starved until t=60 s (the probe measures 60 % input wait), then fed (0 %): the 20 s
    # mean stays above the threshold for ~10 s more, but the job is fed now
    def frame(k):
        t = k / 2
        return Frame(t=t, gpus=gpu(util=50.0), process=job(t),
                     ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=30 * GiB, reserved=35 * GiB,
                                       input_wait=0.6 if t < 60 else 0.0, steps=k, step_time=0.1),))
    mon = Monitor(Simulator().info())
    for k in range(2 * 90):
        mon.ingest(frame(k))
        a = next((a for a in mon.engine.alerts if a.rule == "starvation"), None)
        if a is not None and a.active and k / 2 >= 61:
            assert "60 %" not in a.evidence  # never the starved figure quoted as the wait now
    (a,) = [a for a in mon.engine.alerts if a.rule == "starvation"]
    assert a.start < 60 and a.end is not None and a.end <= 60 + 5
    assert "% of the time over the last 20 s" in a.evidence  # the kept sentence names its window


def test_a_busy_process_that_never_imported_torch_is_not_training_on_the_cpu():
    """A preprocessing script or a shell loop: busy, no GPU memory, and no sign of torch."""
    def frames(torch):
        return [Frame(t=float(t), gpus=gpu(util=0.0, pid=None),
                      process=dataclasses.replace(job(t, cpu=390.0), torch=torch)) for t in range(60)]
    assert not [a for a in run(frames(False)).engine.alerts if a.rule == "cpu_training"]  # looked for: none
    # not known (a recording keeps no such evidence): judged as before, by the CPU and the GPU memory
    assert [a for a in run(frames(None)).engine.alerts if a.rule == "cpu_training"]
    a = next(a for a in run(frames(True)).engine.alerts if a.rule == "cpu_training")  # torch mapped in
    assert "holds no memory on any of the 1 GPU(s)" in a.evidence
    probed = [Frame(t=float(t), gpus=gpu(util=0.0, pid=None), process=job(t, cpu=390.0),
                    ranks=(RankSample(pid=10, cuda=False, torch=t >= 0, steps=0),)) for t in range(60)]
    assert [a for a in run(probed).engine.alerts if a.rule == "cpu_training"]  # the probe saw torch imported
    no_torch = [dataclasses.replace(f, ranks=(RankSample(pid=10, cuda=False, torch=False, steps=0),)) for f in probed]
    assert not [a for a in run(no_torch).engine.alerts if a.rule == "cpu_training"]


def test_training_on_the_cpu_ends_as_soon_as_the_job_has_ended():
    live = [Frame(t=float(t), gpus=gpu(util=0.0, pid=None), process=job(t, cpu=390.0),
                  ranks=(RankSample(pid=10, cuda=False, steps=t * 3),)) for t in range(60)]
    ended = [Frame(t=60.0 + t, gpus=gpu(util=0.0, pid=None),
                   process=ProcessSample(pid=10, alive=False, name="python")) for t in range(3)]
    mon = run(live + ended)
    a = next(a for a in mon.engine.alerts if a.rule == "cpu_training")
    assert a.end is not None and a.end <= 61.0  # at the first sample without the job, not 20 s later


def test_the_process_line_says_no_dataloader_seen_instead_of_an_input_wait_of_nothing():
    from traintop.reports.view import RankView
    from traintop.widgets.process_panel import compact_rank_line, rank_line

    r = RankSample(pid=10, rank=0, cuda=True, steps=30, steps_per_s=3.0, input_wait=None, loader=False)
    for line in (rank_line(RankView(r, 0, None, [], [], [], [], 0.0)),
                 compact_rank_line(RankView(r, 0, None, [], [], [], [], 0.0), 1, 200)):
        text = line.to_text().plain
        assert "no DataLoader seen" in text and "input wait" not in text.replace("\u00a0", " ")
    fed = dataclasses.replace(r, input_wait=0.4, loader=True)
    shown = rank_line(RankView(fed, 0, None, [], [], [], [], None)).to_text().plain
    # the figure kept with its words and unit when the line wraps: never "input" / "wait 40 %"
    assert "input\u00a0wait\u00a040\u00a0%" in shown
    held = dataclasses.replace(r, allocated=10 << 30, reserved=12 << 30, peak=11 << 30)
    # every memory figure with its unit: "peak 11.0" alone read as a count (seen in a new user's trial)
    assert "peak 11.0\u00a0GiB" in rank_line(RankView(held, 0, None, [], [], [], [], None)).to_text().plain
    # steps a GradScaler skipped count as steps: the line says how many of them changed no weight
    assert "skipped" not in rank_line(RankView(r, 0, None, [], [], [], [], None)).to_text().plain
    overflowing = dataclasses.replace(r, skipped_steps=25)
    for line in (rank_line(RankView(overflowing, 0, None, [], [], [], [], None)),
                 compact_rank_line(RankView(overflowing, 0, None, [], [], [], [], None), 1, 200)):
        assert "25\u00a0skipped" in line.to_text().plain


def test_a_hung_collective_is_a_stall_though_its_spinning_kernel_reads_18_percent_sms():
    """Two ranks, one stops calling collectives: the waiting GPU reads 100 % at 126 W of 700 W, tensor
    and DRAM 0 %, but SMs 18 % (occupancy 5 %); both step counters frozen. That is a hang."""
    def frame(t):
        hung = t >= 30
        g0 = GpuSample(index=0, util=100.0, power_w=126.0 if hung else 690.0, power_limit_w=700.0,
                       sm_active=18.0 if hung else 93.0, tensor_active=0.0 if hung else 60.0,
                       dram_active=0.0 if hung else 40.0, processes=(GpuProcess(10, 20 * GiB),))
        g1 = GpuSample(index=1, util=0.0 if hung else 99.0, power_w=120.0 if hung else 690.0, power_limit_w=700.0,
                       sm_active=0.0 if hung else 93.0, tensor_active=0.0 if hung else 60.0, dram_active=0.0,
                       processes=(GpuProcess(11, 20 * GiB),))
        steps = min(t, 30) * 20
        ranks = tuple(RankSample(pid=10 + k, rank=k, world_size=2, device=k, cuda=True, steps=steps,
                                 step_time=0.05, input_wait=0.0, allocated=10 * GiB, reserved=12 * GiB)
                      for k in (0, 1))
        proc = dataclasses.replace(job(t), members=(ProcInfo(10, "python", 100.0, GiB, 10),
                                                    ProcInfo(11, "python", 100.0, GiB, 10)))
        return Frame(t=float(t), gpus=(g0, g1), process=proc, ranks=ranks)
    mon = run([frame(t) for t in range(80)])
    stalls = [a for a in mon.engine.alerts if a.rule == "stall"]
    assert stalls and min(a.start for a in stalls) <= 30 + 35
    assert not [a for a in mon.engine.alerts if a.rule == "imbalance" and not a.explained_by]


def test_a_stalled_job_on_a_machine_without_a_gpu_is_the_jobs_stall_not_gpu_0():
    """A 2-rank CPU job (no GPU visible) that hangs: the stall is the process's. The CPU-training
    finding began 45 s before the hang: the hang is not its cause, and it is not listed under it."""
    def frame(t):
        ranks = tuple(RankSample(pid=10 + k, rank=k, world_size=2, cuda=False, torch=True,
                                 steps=min(t, 60) * 5, step_time=0.2) for k in (0, 1))
        # its threads still spin (a busy-waiting collective): the CPU stays high through the hang
        return Frame(t=float(t), gpus=(), process=job(t, cpu=390.0), ranks=ranks)
    mon = run([frame(t) for t in range(130)])
    (stall,) = [a for a in mon.engine.alerts if a.rule == "stall"]
    assert stall.subject == "process" and stall.severity == Severity.CRITICAL and stall.end is None
    (cpu,) = [a for a in mon.engine.alerts if a.rule == "cpu_training"]
    assert cpu.start < stall.start and cpu.end is None and cpu.explained_by is None


def _ledger_frames(n=150, every=20, pause=5, bucket="checkpoint"):
    from traintop.samples import Frame, GpuProcess, GpuSample, RankSample

    frames = []
    for k in range(n):
        paused = k % every >= every - pause
        g = GpuSample(0, util=0.0 if paused else 97.0, power_w=90.0 if paused else 650.0, power_limit_w=700.0,
                      mem_used=40 << 30, mem_total=140 << 30, processes=(GpuProcess(4242, 40 << 30),))
        shares = {"time_" + bucket: 1.0} if paused else {"time_train": 1.0}
        r = RankSample(pid=4242, rank=0, cuda=True, steps=k * 3, input_wait=0.0, loader=True,
                       **{f"time_{b}": 0.0 for b in ("train", "input", "checkpoint", "eval", "compile", "startup",
                                                      "stalled", "other")} | shares)
        frames.append(Frame(t=1000.0 + k, gpus=(g,), ranks=(r,)))
    return frames


def test_repeated_checkpoints_are_a_pause_never_starvation_or_underuse():
    from traintop.watch.monitor import Monitor
    from traintop.samples import SessionInfo, StackDump, ThreadStack

    m = Monitor(SessionInfo(kind="live", interval=1.0))
    frames = _ledger_frames()
    stack = 'File "train.py", line 88, in save_ckpt\n    torch.save(state, f)\n'
    for k, f in enumerate(frames):
        if k == 40:
            f = __import__("dataclasses").replace(f, stacks=(StackDump(t=f.t, pid=4242, reason="pause", threads=(
                ThreadStack("training thread", True, stack),)),))
        m.ingest(f)
    up = {a.rule: a for a in m.engine.alerts}
    assert "pause" in up and "starvation" not in up and "underuse" not in up and "stall" not in up
    ev = up["pause"].evidence
    assert "mostly checkpoints" in ev and "no input wait" in ev and "torch.save(state, f)" in ev
    assert up["pause"].subject == "gpu0"  # costed on its GPU


def test_a_rank_waiting_at_a_barrier_names_the_rank_that_checkpoints_alone():
    """Rank 0 (GPU 0) saves alone while rank 1 (GPU 1) waits for it at a barrier: GPU 1's pause is
    a wait in a collective, and its finding says for whom."""
    import dataclasses

    from traintop.watch.monitor import Monitor
    from traintop.samples import GpuProcess, SessionInfo

    def run(job0, job1):
        m = Monitor(SessionInfo(kind="live", interval=1.0))
        for f in _ledger_frames():
            r0 = f.ranks[0]
            paused = r0.time_checkpoint == 1.0
            r1 = dataclasses.replace(r0, pid=4243, rank=1, device=1, time_checkpoint=0.0,
                                     time_collective=1.0 if paused else 0.0)
            g1 = dataclasses.replace(f.gpus[0], index=1, processes=(GpuProcess(4243, 40 << 30),))
            m.ingest(dataclasses.replace(f, gpus=(f.gpus[0], g1), ranks=(
                dataclasses.replace(r0, world_size=2, job=job0), dataclasses.replace(r1, world_size=2, job=job1))))
        return m

    m = run("77", "77")
    pauses = {a.subject: a for a in m.engine.alerts if a.rule == "pause"}
    assert set(pauses) == {"gpu0", "gpu1"}
    assert "mostly checkpoints" in pauses["gpu0"].evidence
    waiting = pauses["gpu1"].evidence
    assert "mostly waits for the other ranks in blocking collectives" in waiting
    assert "meanwhile rank 0 paused for checkpoints" in waiting
    assert not [a for a in m.engine.alerts if a.rule in ("starvation", "underuse", "stall")]
    # two jobs sharing the host: one job's checkpoint is not what the other job's rank waits for
    pauses = {a.subject: a for a in run("77", "78").engine.alerts if a.rule == "pause"}
    assert "mostly waits for the other ranks" in pauses["gpu1"].evidence
    assert "meanwhile" not in pauses["gpu1"].evidence


def test_a_per_step_wait_is_no_pause_and_a_pause_ends_with_its_job():
    """A per-step all-reduce that waits a little every step (20 % of each sample) beside checkpoint
    gaps: the pauses are the checkpoints, and the finding says so; when the job exits it ends at
    once, not 30 s later (seen on a real 2-rank job)."""
    import dataclasses

    from traintop.watch.monitor import Monitor
    from traintop.samples import SessionInfo

    m = Monitor(SessionInfo(kind="live", interval=1.0))
    frames = _ledger_frames(n=150)
    for k, f in enumerate(frames):
        r = f.ranks[0]
        if r.time_train == 1.0:
            r = dataclasses.replace(r, time_train=0.8, time_collective=0.2)
        alive = k < 120
        proc = dataclasses.replace(job(f.t), pid=4242, alive=alive)
        m.ingest(dataclasses.replace(f, ranks=(r,) if alive else (), process=proc))
        if k == 119:
            (up,) = [a for a in m.engine.alerts if a.rule == "pause" and a.end is None]
            assert "mostly checkpoints" in up.evidence and "collective" not in up.evidence
            assert [x.split(":")[0] for x in up.remedies] == ["Checkpoints"]  # only the advice that fits
    (pause,) = [a for a in m.engine.alerts if a.rule == "pause"]
    assert pause.end is not None and pause.end <= frames[120].t + 1.0


def test_a_single_long_evaluation_is_no_pause_and_no_stall():
    from traintop.watch.monitor import Monitor
    from traintop.samples import SessionInfo

    m = Monitor(SessionInfo(kind="live", interval=1.0))
    frames = _ledger_frames(n=120, every=200, pause=0)
    # 45 s of evaluation in the middle: the GPU busy, no optimizer step, the ledger says eval
    import dataclasses
    for k, f in enumerate(frames):
        if 40 <= k < 85:
            r = dataclasses.replace(f.ranks[0], steps=120, time_train=0.0, time_eval=1.0)
            f = dataclasses.replace(f, ranks=(r,))
        elif k >= 85:
            f = dataclasses.replace(f, ranks=(dataclasses.replace(f.ranks[0], steps=120 + (k - 85) * 3),))
        m.ingest(f)
    rules = {a.rule for a in m.engine.alerts}
    assert "stall" not in rules and "pause" not in rules


def _long_save_frames(rank1_bucket: str, n: int = 110, dt: float = 1.0, job1: str = "7"):
    """Two ranks on two GPUs train for 30 samples; then rank 0's ledger says ``checkpoint`` and
    rank 1's ``rank1_bucket`` for 60 samples (or to the end when ``dt`` > 1), no step, both GPUs
    idle; then they train again. Rank 1 is of job ``job1``."""
    import dataclasses

    from traintop.samples import GpuProcess

    frames = []
    for k, f in enumerate(_ledger_frames(n=n, every=10_000, pause=0)):
        f = dataclasses.replace(f, t=1000.0 + k * dt)
        saving = 30 <= k < (90 if dt == 1.0 else n)
        steps = min(k, 30) * 3 + (max(0, k - 90) * 3 if dt == 1.0 else 0)
        zero = {f"time_{b}": 0.0 for b in ("train", "checkpoint", "collective", "eval", "other")}
        r0 = dataclasses.replace(f.ranks[0], steps=steps, world_size=2, job="7",
                                 **(zero | ({"time_checkpoint": 1.0} if saving else {"time_train": 1.0})))
        r1 = dataclasses.replace(r0, pid=4243, rank=1, device=1, job=job1,
                                 **(zero | ({"time_" + rank1_bucket: 1.0} if saving else {"time_train": 1.0})))
        g0 = dataclasses.replace(f.gpus[0], util=0.0 if saving else 97.0, power_w=90.0 if saving else 650.0)
        g1 = dataclasses.replace(g0, index=1, processes=(GpuProcess(4243, 40 << 30),))
        frames.append(dataclasses.replace(f, gpus=(g0, g1), ranks=(r0, r1)))
    return frames


def test_a_rank_waiting_at_a_barrier_for_a_long_checkpoint_is_no_stall():
    """`if rank == 0: torch.save(...)` then `dist.barrier()`, the save taking a minute: rank 0 is in
    its checkpoint, rank 1 waits for it in a collective. Nothing is stuck; if both wait in
    collectives with nobody working, that is a hang."""
    from traintop.watch.monitor import Monitor
    from traintop.samples import SessionInfo

    m = Monitor(SessionInfo(kind="live", interval=1.0))
    for f in _long_save_frames("collective", n=88):
        m.ingest(f)
    assert "stall" not in {a.rule for a in m.engine.alerts}
    # the GPUs did sit idle for a minute: said, with what the ledger says each rank was doing
    idle = {a.subject: a.evidence for a in m.engine.alerts if a.rule == "idle_gpu"}
    assert "rank 0: in checkpoints 100 %" in idle["gpu0"]
    assert "rank 1: waiting for other ranks in collectives 100 %" in idle["gpu1"]
    import dataclasses

    hung = Monitor(SessionInfo(kind="live", interval=1.0))
    for f in _long_save_frames("collective", n=88):  # rank 0 in a collective too: nobody works
        r0 = f.ranks[0]
        if r0.time_checkpoint:
            f = dataclasses.replace(f, ranks=(dataclasses.replace(r0, time_checkpoint=0.0, time_collective=1.0),
                                              f.ranks[1]))
        hung.ingest(f)
    assert "stall" in {a.rule for a in hung.engine.alerts}


def test_a_wait_in_another_jobs_collective_or_a_save_that_never_ends_is_a_stall():
    """The exemption is per job, and bounded: job 8's rank waiting in a collective is not waiting
    for job 7's checkpoint; a save with no step for 15 min (a dead file system) is a stall."""
    from traintop.watch.monitor import Monitor
    from traintop.samples import SessionInfo

    other_job = Monitor(SessionInfo(kind="live", interval=1.0))
    for f in _long_save_frames("collective", n=88, job1="8"):
        other_job.ingest(f)
    assert "stall" in {a.rule for a in other_job.engine.alerts}
    # another user's job that names itself job 7 (its own word) is another job too
    import dataclasses

    forged = Monitor(SessionInfo(kind="live", interval=1.0))
    for f in _long_save_frames("collective", n=88):
        forged.ingest(dataclasses.replace(f, ranks=(dataclasses.replace(f.ranks[0], uid=1001),
                                                    dataclasses.replace(f.ranks[1], uid=1002))))
    assert "stall" in {a.rule for a in forged.engine.alerts}
    endless = Monitor(SessionInfo(kind="live", interval=2.0))
    frames = _long_save_frames("collective", n=520, dt=2.0)
    for f in frames[:430]:  # 800 s into the save: still a save
        endless.ingest(f)
    assert "stall" not in {a.rule for a in endless.engine.alerts}
    for f in frames[430:]:  # past 15 min
        endless.ingest(f)
    assert "stall" in {a.rule for a in endless.engine.alerts}


def test_a_deadlocked_jobs_overdue_steps_are_its_stall_not_pauses_of_their_own():
    """Two ranks checkpoint briefly now and then (too little to be a pause finding), then deadlock:
    rank 0's step overdue in its own code, rank 1 waiting in a collective, both GPUs idle; after 30 s
    the probes say stalled. The pauses that the hang's overdue steps make are the stall's, shown
    under it, never beside it with checkpoint advice."""
    import dataclasses

    from traintop.watch.monitor import Monitor
    from traintop.samples import GpuProcess, SessionInfo

    m = Monitor(SessionInfo(kind="live", interval=1.0))
    hang, before = 60, None
    for k, f in enumerate(_ledger_frames(n=160, every=15, pause=1)):
        r0 = dataclasses.replace(f.ranks[0], world_size=2, job="7", device=0)
        if k >= hang:
            bucket0, bucket1 = ("other", "collective") if k < hang + 30 else ("stalled", "stalled")
            zero = {f"time_{b}": 0.0 for b in ("train", "checkpoint", "collective", "other", "stalled")}
            r0 = dataclasses.replace(r0, steps=hang * 3, **(zero | {"time_" + bucket0: 1.0}))
            r1 = dataclasses.replace(r0, pid=4243, rank=1, device=1, **(zero | {"time_" + bucket1: 1.0}))
            g0 = dataclasses.replace(f.gpus[0], util=0.0, power_w=90.0)
        else:
            r1 = dataclasses.replace(r0, pid=4243, rank=1, device=1, time_checkpoint=0.0,
                                     time_collective=r0.time_checkpoint)
            g0 = f.gpus[0]
        g1 = dataclasses.replace(g0, index=1, processes=(GpuProcess(4243, 40 << 30),))
        m.ingest(dataclasses.replace(f, gpus=(g0, g1), ranks=(r0, r1)))
        if k == hang - 1:
            before = {a.rule for a in m.engine.alerts}
    assert "pause" not in before
    stalls = [a for a in m.engine.active if a.rule == "stall"]
    assert stalls
    pauses = [a for a in m.engine.active if a.rule == "pause"]
    assert pauses and all(a.explained_by and a.explained_by.startswith("stall ") for a in pauses), pauses


# -- advice with this machine's numbers, where they are known; never invented ------------------

def _starved(host=None, workers=1, gpus=1, process=True):
    """A job on ``gpus`` GPUs (a rank each) whose GPUs idle in gaps while its probe measures a 55 % input wait."""
    members = [ProcInfo(10 + g, "python", 100.0, GiB, 10, ppid=1 if g == 0 else 10) for g in range(gpus)]
    members += [ProcInfo(100 + k, "pt_data_worker", 95.0, GiB, 2, True, 10 + k % gpus) for k in range(workers)]
    proc = ProcessSample(pid=10, alive=True, name="python", cpu_percent=150.0, members=tuple(members))
    ranks = tuple(RankSample(pid=10 + g, rank=g, world_size=gpus, device=g, cuda=True, allocated=30 * GiB,
                             reserved=35 * GiB, input_wait=0.55, steps=1, step_time=0.2) for g in range(gpus))

    def devices(t):  # idle one second in three: the gaps of a starved GPU, seen without the job too
        return tuple(GpuSample(index=g, util=0.0 if t % 3 == 0 else 100.0, mem_used=40 * GiB, mem_total=140 * GiB,
                               power_w=600, power_limit_w=700, processes=(GpuProcess(10 + g, 40 * GiB),))
                     for g in range(gpus))
    frames = [Frame(t=float(t), gpus=devices(t), host=host, process=proc if process else None,
                    ranks=ranks if process else ()) for t in range(60)]
    info = Simulator(",".join(["healthy"] * gpus), gpus=gpus).info()
    alerts = [a for a in run(frames, info).engine.alerts if a.rule == "starvation"]
    assert alerts, "no starvation found"
    return alerts[0].remedies[0]


def _cores(n):
    return HostSample(cpu_percent=20.0, per_core=(20.0,) * n)


def test_the_worker_advice_counts_the_hosts_free_cores_per_gpu():
    # 16 cores, one training process, one worker: 14 left for workers (one core for the system)
    assert _starved(_cores(16), workers=1) == ("Raise DataLoader num_workers (try 14: this host's 16 CPU cores, "
                                              "less 1 for the training process and 1 for the system, over 1 GPU; "
                                              "1 worker now).")
    eight = _starved(_cores(128), workers=16, gpus=8)  # (128 - 8 ranks - 1) // 8
    assert "try 14 per GPU" in eight and "less 8 for 8 training processes" in eight and "16 workers in all now" in eight
    assert _starved(_cores(8), workers=0).startswith("Raise DataLoader num_workers (try 6: ") \
        and _starved(_cores(8), workers=0).endswith("; num_workers=0 now).")  # loading in the training process
    full = _starved(_cores(4), workers=3)  # 1 + 3 of 4 cores: none free
    assert full == ("Raise DataLoader num_workers only where CPU cores are free: this host's 4 cores already run the "
                    "training process and 3 loader workers (for 1 GPU); else make each worker's work cheaper (below).")


def test_the_worker_advice_says_no_number_it_does_not_know():
    generic = "Raise DataLoader num_workers (try the number of free CPU cores per GPU)."
    assert _starved(None) == generic  # no host data (an nvidia-smi log)
    # the cores known, the job not attached: how many it runs is not known, so no count to try
    assert _starved(_cores(16), process=False) == ("Raise DataLoader num_workers (try the number of free CPU cores "
                                                   "per GPU: this host has 16 for 1 GPU in use).")


def _starved_on_cpu(host, workers=1):
    """A CPU job (no GPU in view) whose probe measures a 90 % input wait: its starvation's first remedy."""
    members = [ProcInfo(10, "python", 100.0, GiB, 10, ppid=1)]
    members += [ProcInfo(100 + k, "pt_data_worker", 95.0, GiB, 2, True, 10) for k in range(workers)]
    proc = ProcessSample(pid=10, alive=True, name="python", cpu_percent=150.0, members=tuple(members))
    rank = RankSample(pid=10, cuda=False, loader=True, steps=1, input_wait=0.9, time_train=0.1, time_input=0.9)
    frames = [Frame(t=float(t), gpus=(), host=host, process=proc, ranks=(rank,)) for t in range(40)]
    alerts = [a for a in run(frames, SessionInfo(kind="live", interval=1.0)).engine.alerts if a.rule == "starvation"]
    assert alerts, "no starvation found"
    return alerts[0].remedies[0]


def test_the_worker_advice_on_no_gpu_gives_this_hosts_cores_and_no_count_to_try():
    """A job that computes on the CPU needs the cores for its own threads: "free cores per GPU" fits
    no such job; the host's cores and the job's workers do (seen in a new user's trial)."""
    advice = _starved_on_cpu(_cores(16), workers=1)
    assert advice == ("Raise DataLoader num_workers only as far as CPU cores are free: this host has 16, and a job "
                      "that computes on the CPU needs them for its own threads too; 1 worker now.")
    assert "per GPU" not in _starved_on_cpu(_cores(4), workers=0) and "num_workers=0 now" in _starved_on_cpu(_cores(4), 0)
    assert _starved_on_cpu(None) == "Raise DataLoader num_workers where CPU cores are free."  # no host data


def _underused(ranks=True, mem=True):
    """A GPU drawing 20 % of its power limit with 100 GiB of its 140 GiB free; with the probe, a rank
    that holds 10 GiB between steps and peaks at 30 GiB."""
    def frame(t):
        g = GpuSample(index=0, util=40.0, mem_used=40 * GiB if mem else None, mem_total=140 * GiB if mem else None,
                      power_w=140.0, power_limit_w=700.0, processes=(GpuProcess(10, 40 * GiB),))
        r = RankSample(pid=10, rank=0, cuda=True, allocated=(10 if t % 2 else 30) * GiB, reserved=36 * GiB,
                       peak=30 * GiB, steps=t, step_time=0.1, input_wait=0.01)
        return Frame(t=float(t), gpus=(g,), process=job(t, cpu=60.0), ranks=(r,) if ranks else ())
    alerts = [a for a in run([frame(t) for t in range(90)]).engine.alerts if a.rule == "underuse"]
    assert alerts, "no underuse found"
    return alerts[0].remedies[0]


def test_the_batch_advice_gives_the_free_memory_and_the_growth_it_allows():
    # 100 GiB free, 20 GiB a step above what it holds: 1 + 0.9 * 100 / 20 = 5.5
    assert _underused() == ("Raise the batch size while memory allows (GPU 0 has 100.0 GiB free: the batch can "
                            "likely grow ~6x (a step allocates 20.0 GiB above what it holds between steps); "
                            "scale the learning rate with it).")


def test_the_batch_advice_says_no_growth_it_cannot_measure():
    # without the probe, what a step allocates is not known: the free memory only
    assert _underused(ranks=False) == ("Raise the batch size while memory allows (GPU 0 has 100.0 GiB free; "
                                       "scale the learning rate with it).")
    assert _underused(ranks=False, mem=False) == "Raise the batch size while memory allows (scale the learning rate with it)."
