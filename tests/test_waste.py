"""The one GPU-hours formula (traintop.reports.waste) and every front end that calls it."""

import json
from array import array

import pytest

from traintop.reports import waste
from traintop.reports.analyze import _Acc, analyze
from traintop.cluster.fetch import AgentFinding, ClusterData, GpuData
from traintop.cluster.report import agent_findings, gpu_series
from traintop.collectors.simulated import Simulator
from traintop.findings import Finding, Severity
from traintop.record.recording import RecordingReader, RecordingWriter
from traintop.rules import DEFAULT, RULES_VERSION
from traintop.rules.config import host_values
from traintop.samples import Frame, GpuSample


def _series(times, values, holds):
    return waste.Series(array("d", times), array("d", values), holds)


def test_each_sample_holds_until_the_next_and_the_last_ends_a_recording():
    s = _series([0, 1, 2, 3], [0.5, 1.0, float("nan"), 1.0], waste.Holds.recording(1.0))
    assert s.seconds() == pytest.approx(0.5 + 1.0)  # unknown holds nothing; the last sample ends the session
    assert s.seconds(0.5, 1.5) == pytest.approx(0.25 + 0.5)  # the sample before a span holds into it
    assert s.hours(0, 3) == pytest.approx(1.5 / 3600)


def test_a_gap_in_the_samples_costs_a_few_intervals_not_the_gap():
    # a suspended machine: samples at 0-2 s, then nothing until 100 s
    s = _series([0, 1, 2, 100, 101], [1.0] * 5, waste.Holds.recording(1.0))
    assert s.seconds() == pytest.approx(1 + 1 + waste.GAP_INTERVALS + 1)
    # an imported log says its interval only by its times: 10 s apart is no gap
    log = _series([0, 10, 20, 30], [1.0] * 4, waste.Holds.recording(1.0, [0, 10, 20, 30]))
    assert log.seconds() == pytest.approx(30)


def test_on_a_grid_a_point_without_a_neighbour_stands_for_a_few_scrapes():
    holds = waste.Holds.grid(60.0)
    s = waste.Series.of_points({0.0: 1.0, 60.0: 1.0, 180.0: 1.0}, holds)  # 120 missing
    assert s.seconds() == pytest.approx(60 + waste.LAST_POINT_S + waste.LAST_POINT_S)


def test_a_stall_costs_the_whole_gpu_even_at_100_percent_and_an_explained_finding_nothing():
    acc = _Acc(0, "GPU")
    for t in range(61):
        acc.add(float(t), GpuSample(index=0, util=100.0))  # a spinning collective reads 100 %
    gpus = {0: acc.series(1.0)}
    assert waste.finding_cost("stall", "gpu0", None, 0.0, 60.0, gpus)[0] == pytest.approx(60 / 3600)
    assert waste.finding_cost("starvation", "gpu0", None, 0.0, 60.0, gpus)[0] == 0.0  # busy: not idle
    assert waste.finding_cost("idle_gpu", "gpu0", "stall gpu0", 0.0, 60.0, gpus)[0] == 0.0  # counted by the stall
    assert waste.finding_cost("memory_creep", "gpu0", None, 0.0, 60.0, gpus)[0] == 0.0
    assert waste.finding_cost("stall", "process", None, 0.0, 60.0, gpus)[0] == 0.0  # no GPU of its own


def test_a_finding_about_all_gpus_costs_each_of_them():
    accs = {i: _Acc(i, "GPU") for i in (0, 1)}
    for t in range(11):
        accs[0].add(float(t), GpuSample(index=0, util=90.0))
        accs[1].add(float(t), GpuSample(index=1, util=40.0))
    gpus = {i: a.series(1.0) for i, a in accs.items()}
    lost, _ = waste.finding_cost("imbalance", "gpus", None, 0.0, 10.0, gpus)
    assert lost == pytest.approx(10 * (0.1 + 0.6) / 3600)


def test_a_straggler_costs_the_time_every_other_gpu_waits_for_it():
    """Two ranks on two GPUs, rank 1 slow: GPU 0 spins in NCCL at 100 % "utilization" while GPU 1
    computes 10 % of the time (the 2 x H200 ddp-straggler recording). GPU 0 waits 90 % of the time;
    GPU 1's own idle time is its own finding's (starvation, where its input is the cause)."""
    accs = {i: _Acc(i, "GPU") for i in (0, 1)}
    for t in range(11):
        accs[0].add(float(t), GpuSample(index=0, util=100.0))
        accs[1].add(float(t), GpuSample(index=1, util=10.0))
    gpus = {i: a.series(1.0) for i, a in accs.items()}
    lost, _ = waste.finding_cost("straggler", "gpu1", None, 0.0, 10.0, gpus)
    assert lost == pytest.approx(10 * 0.9 / 3600)
    samples = {0: GpuSample(index=0, util=100.0), 1: GpuSample(index=1, util=10.0)}
    assert waste.sample_cost("straggler", "gpu1", None, samples) == pytest.approx(0.9)  # the agent's, per tick
    # four GPUs: three wait
    samples.update({2: GpuSample(index=2, util=100.0), 3: GpuSample(index=3, util=100.0)})
    assert waste.sample_cost("straggler", "gpu1", None, samples) == pytest.approx(3 * 0.9)
    # a shared node: GPU 3 idle (no job, or another job's between its steps) waits for nobody
    samples[3] = GpuSample(index=3, util=0.0)
    assert waste.sample_cost("straggler", "gpu1", None, samples) == pytest.approx(2 * 0.9)
    accs[2] = _Acc(2, "GPU")
    for t in range(11):
        accs[2].add(float(t), GpuSample(index=2, util=0.0))
    gpus = {i: a.series(1.0) for i, a in accs.items()}
    assert waste.finding_cost("straggler", "gpu1", None, 0.0, 10.0, gpus)[0] == pytest.approx(lost)
    assert waste.sample_cost("straggler", "gpu1", "stall gpus", samples) == 0.0  # explained: counted there


def test_a_straggler_costs_the_same_summed_per_tick_or_integrated_over_the_finding():
    """A neighbour GPU busy for 1 s of 10 waits for the straggler that second only, whichever way
    the cost is taken (the agent per tick, analyze over the finding)."""
    accs = {i: _Acc(i, "GPU") for i in (0, 1, 2)}
    per_tick = 0.0
    for t in range(10):
        row = {0: GpuSample(index=0, util=100.0), 1: GpuSample(index=1, util=10.0),
               2: GpuSample(index=2, util=100.0 if t == 0 else 0.0)}
        for i, g in row.items():
            accs[i].add(float(t), g)
        per_tick += waste.sample_cost("straggler", "gpu1", None, row)  # one tick: 1 s
    accs[0].add(10.0, GpuSample(index=0, util=100.0))
    accs[1].add(10.0, GpuSample(index=1, util=10.0))
    accs[2].add(10.0, GpuSample(index=2, util=0.0))
    gpus = {i: a.series(1.0) for i, a in accs.items()}
    lost, _ = waste.finding_cost("straggler", "gpu1", None, 0.0, 10.0, gpus)
    assert per_tick == pytest.approx(11 * 0.9)  # GPU 0 ten ticks, GPU 2 one
    assert lost * 3600 == pytest.approx(per_tick)


def _util(t: int) -> float:
    return [0.9, 0.2, 0.0, 0.5, 1.0][t % 5]


def test_analyze_the_cluster_report_and_the_agent_cost_one_series_alike():
    """The same minute of one GPU, a finding over 10..40 s: a recording's samples (analyze), a
    Prometheus grid at 1 s (the cluster report), and the agent's counter tick by tick."""
    times = list(range(60))
    acc = _Acc(0, "GPU")
    for t in times:
        acc.add(float(t), GpuSample(index=0, util=100 * _util(t), sm_clock=1000 + 10 * t, sm_clock_max=1980))
    local = waste.finding_cost("starvation", "gpu0", None, 10.0, 40.0, {0: acc.series(1.0)})[0]

    data = ClusterData("test", 0.0, 59.0, 1.0, [float(t) for t in times])
    g = data.gpus[("n1", 0)] = GpuData("n1", 0, "NVIDIA H200")
    for t in times:
        g.util[float(t)], g.clock_ratio[float(t)] = _util(t), (1000 + 10 * t) / 1980
    data.findings.append(AgentFinding("n1", "starvation", "warning", "gpu0", [float(t) for t in range(10, 40)]))
    (cluster,) = agent_findings(data)
    assert (cluster.start, cluster.end) == (10.0, 40.0)
    assert cluster.gpu_hours == round(local, 4) and local > 0

    holds = waste.Holds.recording(1.0)
    ticks = sum(holds.held(t, t + 1) * waste.sample_cost("starvation", "gpu0", None,
                                                         {0: GpuSample(index=0, util=100 * _util(t))})
                for t in range(10, 40))
    assert ticks / 3600 == pytest.approx(local)
    # thermal: the clock's shortfall, by both paths
    thermal = waste.finding_cost("thermal", "gpu0", None, 10.0, 40.0, {0: acc.series(1.0)})[0]
    assert thermal == pytest.approx(waste.finding_cost("thermal", "gpu0", None, 10.0, 40.0,
                                                       {0: gpu_series(g, 1.0)})[0])


def test_a_recorded_critical_stall_loses_its_gpu_time_in_analyze(tmp_path):
    """A stall at 100 % utilization (a spinning collective) lost 0.000 GPU-hours where a copy of the
    formula costed only idle shares."""
    sim = Simulator("healthy", gpus=1, interval=1.0, seed=1)
    path = str(tmp_path / "stall.ttrec")
    w = RecordingWriter(path, sim.info())
    w.set_meta("rules", json.dumps({"version": RULES_VERSION, "thresholds": host_values(DEFAULT)}))
    frames = [Frame(t=1000.0 + k, gpus=(GpuSample(index=0, util=100.0, power_w=400.0),)) for k in range(121)]
    for f in frames:
        w.add(f)
    w.alert(Finding("stall", "Job stalled", "gpu0", Severity.CRITICAL, 1060.0, None, "no step for 60 s", (), id=1))
    w.close()
    reader = RecordingReader(path)
    assert reader.judged_by(None)  # the recorded finding is taken as it is
    report = analyze(reader, name="stall")
    (stall,) = report.findings
    assert stall.end == 1120.0 and stall.gpu_hours == round(60 / 3600, 4)
    assert stall.energy_kwh == pytest.approx(60 * 400 / 3.6e6, abs=1e-4)
    assert report.gpu_hours == round(120 / 3600, 4) and report.gpu_hours_lost == stall.gpu_hours
    (doc,) = json.loads(json.dumps(report.to_dict()))["findings"]
    assert (doc["severity"], doc["start_s"], doc["end_s"], doc["gpu_hours_lost"]) == ("critical", 60.0, 120.0,
                                                                                     stall.gpu_hours)
