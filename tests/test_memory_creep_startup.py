"""A job starting up (its weights, optimizer state and first activations arriving on the GPU) is no
creeping memory, in a short log or a long one; a leak after it still is, and so is one that never
stops rising."""

import pytest

from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.samples import Frame, GpuProcess, GpuSample, RankSample
from traintop.units import GiB, MiB

TOTAL = 140 * GiB


def _frames(used_at, seconds: float, dt: float = 0.1, ranks_at=None):
    out = []
    for k in range(int(seconds / dt)):
        t = 1000.0 + k * dt
        used = int(used_at(t - 1000.0))
        gpu = GpuSample(index=0, util=90.0, power_w=500.0, mem_used=used, mem_total=TOTAL,
                        processes=(GpuProcess(10, used),) if used > 600 * MiB else ())
        out.append(Frame(t=t, gpus=(gpu,), ranks=ranks_at(t - 1000.0) if ranks_at else ()))
    return out


def _creep(frames):
    mon = Monitor(Simulator(gpus=1).info())
    for f in frames:
        mon.ingest(f)
    mon.engine.close_all(frames[-1].t)
    return [a for a in mon.engine.alerts if a.rule == "memory_creep"]


def _ramp(t, start=5.0, ramp=20.0, to=4.6 * GiB):
    """Idle, then the job's memory rising from 0.5 GiB to ``to`` over ``ramp`` s, then flat."""
    idle = 0.5 * GiB
    return idle if t < start else min(to, idle + (to - idle) * (t - start) / ramp)


@pytest.mark.parametrize("seconds", [49.0, 600.0])
def test_a_start_up_ramp_is_no_creep_in_a_short_log_or_a_long_one(seconds):
    assert _creep(_frames(_ramp, seconds)) == []


def test_a_slow_start_up_of_a_large_model_is_no_creep_either():
    # 60 GiB of weights loaded over 90 s, then training at a steady level
    assert _creep(_frames(lambda t: _ramp(t, ramp=90.0, to=60 * GiB), 400.0, dt=0.5)) == []


def test_a_leak_after_the_start_up_is_still_found():
    def used(t):
        return _ramp(t) + (0.0 if t < 60 else (t - 60) * 0.4 * GiB)  # 0.4 GiB/s from 60 s on
    (creep,) = _creep(_frames(used, 150.0))
    assert 60 < creep.start - 1000.0 < 100


def test_a_rise_that_never_settles_is_creep_once_no_start_up_lasts_that_long():
    (creep,) = _creep(_frames(lambda t: 0.5 * GiB + t * 0.3 * GiB, 300.0, dt=0.5))
    assert creep.start - 1000.0 >= 120.0


def test_with_the_probe_the_start_up_lasts_until_its_second_optimizer_step():
    """Allocated rises while the job makes its optimizer state at its first step: no creep; a rank
    whose allocated rises after that, step after step, leaks."""
    def steps(t):
        return 0 if t < 25 else int((t - 25) * 4)

    def ranks(t):
        alloc = _ramp(t, ramp=25.0, to=20 * GiB) + (0.0 if t < 80 else (t - 80) * 0.3 * GiB)
        return (RankSample(pid=10, rank=0, cuda=True, allocated=int(alloc), reserved=int(alloc + GiB),
                           steps=steps(t)),)
    frames = _frames(lambda t: ranks(t)[0].reserved + 500 * MiB, 160.0, dt=0.1, ranks_at=ranks)
    (creep,) = _creep(frames)
    assert creep.start - 1000.0 > 80
