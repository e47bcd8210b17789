"""The ledger: what each finding cost in GPU-hours and energy, and fragmentation judged against the peak."""

import pytest

from traintop.reports.analyze import analyze, render_text
from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.samples import Frame, GpuProcess, GpuSample, ProcessSample, ProcInfo, RankSample
from traintop.units import GiB, MiB


class _Frames:
    kind = "simulated"

    def __init__(self, frames, info=None):
        self.info, self._frames = info or Simulator(gpus=2).info(), frames

    def frames(self):
        return iter(self._frames)


def _job():
    return ProcessSample(pid=10, alive=True, name="python", cpu_percent=100.0,
                         members=(ProcInfo(10, "python", 100.0, GiB, 9), ProcInfo(11, "python", 100.0, GiB, 9, ppid=10)))


def test_fragmentation_is_judged_against_the_windows_peak_allocated():
    """A healthy conv job: allocated sampled between steps reads 70 MiB, within them 19 GiB."""
    def frame(t):
        allocated = 70 * MiB if t % 12 else 19 * GiB  # the sampler rarely lands inside a step
        return Frame(t=float(t), gpus=(GpuSample(index=0, util=99.0, mem_used=21 * GiB, mem_total=140 * GiB,
                                                 processes=(GpuProcess(10, 21 * GiB),)),),
                     process=_job(), ranks=(RankSample(pid=10, rank=0, cuda=True, allocated=allocated,
                                                       reserved=int(20.4 * GiB), inactive_split=8 * GiB,
                                                       alloc_retries=0, ooms=0),))
    mon = Monitor(Simulator().info())
    for t in range(120):
        mon.ingest(frame(t))
    assert not [a for a in mon.engine.alerts if a.rule == "fragmentation"]


def _two(t, energy=True):
    read = t - t % 30 if energy == "every 30 s" else t  # the counter is read every 30 s; ticks repeat it

    def g(i, util, power):
        return GpuSample(index=i, util=util, power_w=power, power_limit_w=700.0, mem_used=20 * GiB,
                         mem_total=140 * GiB, energy_j=(1000.0 + power * read) if energy else None,
                         processes=(GpuProcess(10 + i, 20 * GiB),))
    return Frame(t=float(t), gpus=(g(0, 95.0, 600.0), g(1, 40.0, 300.0)), process=_job())


@pytest.mark.parametrize("energy", [True, "every 30 s", False])
def test_imbalance_costs_the_waiting_gpu_time_and_every_finding_reports_its_energy(energy):
    report = analyze(_Frames([_two(t, energy) for t in range(200)]))
    (imb,) = [f for f in report.findings if f.rule == "imbalance"]
    # GPU 0 idle 5 %, GPU 1 idle 60 % of the finding's time
    duration_s = imb.end - imb.start
    assert imb.gpu_hours == pytest.approx(duration_s * (0.05 + 0.60) / 3600, rel=0.05)
    # both GPUs' energy while it lasted: 600 W + 300 W, from the counter or from power x time
    assert imb.energy_kwh == pytest.approx(duration_s * 900 / 3.6e6, rel=0.05)
    assert report.energy_kwh == pytest.approx(199 * 900 / 3.6e6, rel=0.02)
    text = render_text(report)
    assert f"{report.energy_kwh:.3f} kWh" in text and "kWh drawn" in text
