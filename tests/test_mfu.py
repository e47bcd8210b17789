"""MFU is a property of the steps: their FLOPs over the time the ledger gives them and their input (an
iteration, as nanoGPT times it). A job that evaluates half the time runs its steps at the same MFU;
its goodput, not its MFU, says what the evaluation costs. A job that waits for its input has its
MFU lowered by the wait: the GPU idles then. The same figure in the dashboard, `analyze` (text and
JSON) and the agent."""

import json

import pytest

from traintop.reports.analyze import analyze, render_json, render_text
from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.samples import MATMUL_MODES, Frame, GpuProcess, GpuSample, RankSample
from traintop.units import GiB
from traintop.reports.view import build_view

PEAK = 989.5e12  # the H200's dense bf16 peak
STEP_S = 0.25  # each step's own time
STEP_MFU = 0.40


class _Frames:
    kind = "simulated"

    def __init__(self, frames):
        self.info, self._frames = Simulator(gpus=1).info(), frames

    def frames(self):
        return iter(self._frames)


def _run(seconds: int = 240, interval: float = 0.5, input_share: float = 0.0):
    """Trains for 20 s, evaluates for 20 s, over and over: steps only while training, each step
    waiting ``input_share`` of its iteration for its batch."""
    frames, steps, history = [], 0, []
    for k in range(int(seconds / interval)):
        t = 1000.0 + k * interval
        training = (k * interval) % 40 < 20
        if training:
            steps += round(interval * (1 - input_share) / STEP_S)
        history.append((t, steps))
        t0, s0 = next((h for h in history if t - h[0] <= 10.0), history[0])
        rate = (steps - s0) / (t - t0) if t > t0 else None  # the probe client's rate over 10 s, pauses and all
        rank = RankSample(pid=10, rank=0, cuda=True, steps=steps, steps_per_s=rate, matmul=MATMUL_MODES.index("bf16"),
                          step_flops=STEP_MFU * PEAK * STEP_S, time_train=1.0 - input_share if training else 0.0,
                          time_input=input_share if training else 0.0, time_eval=0.0 if training else 1.0)
        gpu = GpuSample(index=0, util=95.0 if training else 30.0, power_w=600.0, mem_used=40 * GiB,
                        mem_total=140 * GiB, processes=(GpuProcess(10, 40 * GiB),))
        frames.append(Frame(t=t, gpus=(gpu,), ranks=(rank,)))
    return frames


def test_the_dashboard_shows_the_mfu_of_the_steps_not_diluted_by_evaluation():
    mon = Monitor(Simulator(gpus=1).info())
    for f in _run(seconds=55):  # the last 30 s: 5 s of training, then evaluation, then training again
        mon.ingest(f)
    (rank,) = build_view(mon).process.ranks
    assert rank.mfu == pytest.approx(STEP_MFU, rel=0.05)


def test_a_job_waiting_for_its_input_has_its_mfu_lowered_by_the_wait():
    """Half of each iteration waiting for the batch: the GPU idles then, so the MFU is half the steps'
    (as the job's own count over its iterations says), in the dashboard and in `analyze`; never the
    steps' compute time alone, which would read as if the waits did not exist."""
    frames = _run(seconds=55, input_share=0.5)
    mon = Monitor(Simulator(gpus=1).info())
    for f in frames:
        mon.ingest(f)
    (rank,) = build_view(mon).process.ranks
    assert rank.mfu == pytest.approx(STEP_MFU / 2, rel=0.05)
    (ledger,) = analyze(_Frames(_run(input_share=0.5))).ledger
    assert ledger["mfu"] == pytest.approx(STEP_MFU / 2, rel=0.05)


def test_analyze_reports_each_ranks_mfu_over_its_training_time_with_its_peak():
    report = analyze(_Frames(_run()))
    (ledger,) = report.ledger
    assert ledger["goodput"] == pytest.approx(0.5, abs=0.02)
    assert ledger["mfu"] == pytest.approx(STEP_MFU, rel=0.03)
    assert ledger["mfu_peak_tflops"] == 989.5 and ledger["matmul"] == "bf16"
    assert "MFU 40 % over its steps" in render_text(report) and "989.5 TFLOP/s" in render_text(report)
    (as_json,) = json.loads(render_json(report))["ledger"]
    assert as_json["mfu"] == pytest.approx(STEP_MFU, rel=0.03)


def test_no_mfu_without_the_flops_or_a_known_gpu():
    frames = [Frame(t=f.t, gpus=f.gpus, ranks=(RankSample(pid=10, rank=0, cuda=True, steps=f.ranks[0].steps,
                                                          time_train=f.ranks[0].time_train,
                                                          time_eval=f.ranks[0].time_eval),)) for f in _run()]
    (ledger,) = analyze(_Frames(frames)).ledger
    assert ledger["mfu"] is None
    assert "MFU" not in render_text(analyze(_Frames(frames)))
