"""Each GPU of a DDP job is judged by its own rank: its loader workers, its input wait, its step time."""

import re

import pytest

from traintop.reports.analyze import analyze
from traintop.attribution import gpu_feeds
from traintop.collectors.simulated import SCENARIOS, TRAIN_PID, Simulator
from traintop.watch.monitor import Monitor
from traintop.rules import HOLDS, DEFAULT, Severity, default_engine
from traintop.samples import Frame, GpuProcess, GpuSample, ProcessSample, ProcInfo, RankSample
from traintop.units import GiB

NODE = "healthy,starved,underused,thermal,memory_creep,idle,healthy,healthy"
OWN = {"starved": {"starvation"}, "underused": {"underuse"}, "thermal": {"thermal"},
       "memory_creep": {"memory_creep"}, "healthy": set(), "idle": set(), "small_kernels": {"underuse"},
       "pcie_bound": {"pcie"}}


def test_the_simulator_plays_one_process_per_rank_each_with_its_own_workers():
    sim = Simulator(NODE, gpus=8)
    f = sim.next_frame()
    members = {m.pid: m for m in f.process.members}
    feeds = gpu_feeds(f)
    for i, scenario in enumerate(sim.scenarios):
        feed = feeds[i]
        if scenario == "idle":
            assert not feed.pids and not feed.workers
            continue
        assert feed.pids == {TRAIN_PID + i} and [s for s, _ in feed.ranks] == [f"rank{i}"]
        assert feed.workers and all(members[w.pid].ppid == TRAIN_PID + i for w in feed.workers)
        busy = [w.cpu_percent >= 85 for w in feed.workers]
        assert all(busy) if scenario == "starved" else not any(busy)


def test_workers_are_attributed_through_their_parents_and_only_then():
    workers = tuple(ProcInfo(100 + k, "pt_data_worker", 99.0, GiB, 1, True, ppid=11) for k in range(2))
    tree = ProcessSample(pid=10, alive=True, members=(ProcInfo(10, "torchrun", 1.0, GiB, 2, ppid=1),
                                                      ProcInfo(11, "python", 50.0, GiB, 9, ppid=10),
                                                      ProcInfo(12, "python", 50.0, GiB, 9, ppid=10)) + workers)
    gpus = (GpuSample(index=0, processes=(GpuProcess(11, GiB),)), GpuSample(index=1, processes=(GpuProcess(12, GiB),)))
    feeds = gpu_feeds(Frame(t=0.0, gpus=gpus, process=tree))
    assert {w.pid for w in feeds[0].workers} == {100, 101} and not feeds[1].workers
    # without parent PIDs (older recordings) a two-GPU job's workers cannot be placed
    orphans = tuple(ProcInfo(w.pid, w.name, w.cpu_percent, w.rss, w.threads, True) for w in workers)
    feeds = gpu_feeds(Frame(t=0.0, gpus=gpus, process=ProcessSample(10, True, members=tree.members[:3] + orphans)))
    assert not feeds[0].workers and not feeds[1].workers
    one_gpu = gpu_feeds(Frame(t=0.0, gpus=gpus[:1], process=ProcessSample(10, True, members=tree.members[:3] + orphans)))
    assert len(one_gpu[0].workers) == 2  # one GPU: they can feed only it


def _own_findings(mon):
    return {(a.subject, a.rule) for a in mon.engine.alerts if a.severity >= Severity.WARNING}


@pytest.mark.parametrize("interval", [0.1, 1.0])
@pytest.mark.parametrize("mix", [NODE, "underused,starved", "starved,healthy,underused,starved"])
def test_analyze_finds_each_gpus_own_pathology(mix, interval):
    sim = Simulator(mix, gpus=len(mix.split(",")), seed=4, interval=interval)
    frames = sim.frames(int(240 / interval))
    report = analyze(_Frames(sim.info(), frames))
    found = {(f.subject, f.rule) for f in report.findings if f.severity > Severity.INFO}
    expected = {(f"gpu{i}", rule) for i, s in enumerate(sim.scenarios) for rule in OWN[s]}
    assert found - {("gpus", "imbalance")} == expected  # the GPUs of these jobs are indeed busy unequally


class _Frames:
    """A source for analyze: frames already made."""

    kind = "simulated"

    def __init__(self, info, frames):
        self.info, self._frames = info, frames

    def frames(self):
        return iter(self._frames)


def test_a_rank_that_waits_one_percent_is_not_starved_whatever_its_workers_do():
    """Issue 15: the underused GPU was called starved, quoting a measured wait of 1 %."""
    def frame(t):
        workers = tuple(ProcInfo(20 + k, "pt_data_worker", 99.0, GiB, 1, True, ppid=10) for k in range(2))
        return Frame(t=t, gpus=(GpuSample(index=0, util=6.0, util_min=0.0, util_max=12.0, power_w=120.0,
                                          power_limit_w=700.0, mem_used=10 * GiB, mem_total=140 * GiB,
                                          processes=(GpuProcess(10, 10 * GiB),)),),
                     process=ProcessSample(pid=10, alive=True, members=(ProcInfo(10, "python", 40.0, GiB, 9),)
                                           + workers),
                     ranks=(RankSample(pid=10, rank=0, cuda=True, input_wait=0.01, steps=int(t * 200)),))
    mon = Monitor(Simulator().info())
    for k in range(120):
        mon.ingest(frame(float(k)))
    assert _own_findings(mon) == {("gpu0", "underuse")}


# What each finding's evidence must never quote: a figure on the wrong side of its own threshold.
def _contradictions(rule: str, text: str, c=DEFAULT) -> list[str]:
    bad = []

    def nums(pattern):
        return [float(x) for x in re.findall(pattern, text)]

    if rule == "starvation":
        bad += [f"wait {w} %" for w in nums(r"waits for its next batch (\d+) %") if w < c.starvation_fed_input_wait * 100]
        bad += [f"workers at {w} %" for w in nums(r"loader workers sit at (\d+) % CPU") if w < c.starvation_busy_worker_cpu]
        bad += [f"mean utilization {u} %" for u in nums(r"mean utilization (\d+) %") if u > 90]
    elif rule == "underuse":
        bad += [f"power {p} % of the limit" for p in nums(r"limit \((\d+) %\)") if p >= c.underuse_power_frac * 110]
        bad += [f"utilization {u} %" for u in nums(r"W limit .* at (\d+) % utilization") if u > c.underuse_max_util]
    elif rule == "power_cap":
        bad += [f"utilization {u} %" for u in nums(r"at (\d+) % utilization") if u < c.power_cap_min_util]
    elif rule == "thermal":
        bad += [f"throttled {x} %" for x in nums(r"throttled (\d+) %") if x < c.thermal_min_frac * 100]
    elif rule == "memory_creep":
        bad += [f"rate {x}" for x in nums(r"rising (-?[\d.]+) GiB/s") if x <= 0]
    elif rule == "idle_gpu":
        bad += [f"utilization {u}" for u in nums(r"averages ([\d.]+) % utilization") if u >= c.idle_max_util]
    elif rule == "pcie":
        bad += [f"link {x} %" for x in nums(r"(\d+) % of its\s+PCIe link") if x < c.pcie_min_link_frac * 85]
    elif rule == "imbalance":
        lo, hi = nums(r"averages (\d+) %")[:2]
        bad += [f"gap {hi - lo}"] if hi - lo < c.imbalance_gap else []
    return bad


MIXES = list(SCENARIOS) + [NODE, "underused,starved", "starved,underused,pcie_bound,small_kernels",
                           "memory_creep,starved", "thermal,healthy,starved"]


@pytest.mark.parametrize("mix", MIXES)
def test_evidence_never_quotes_a_number_that_contradicts_its_finding(mix):
    engine = default_engine()
    said = []
    for rule in engine.rules:
        def spy(ctx, rule=rule, real=rule.evaluate):
            out = list(real(ctx))
            said.extend((rule.id, f) for f in out)
            return out
        rule.evaluate = spy
    sim = Simulator(mix, gpus=len(mix.split(",")), seed=9, interval=0.5)
    mon = Monitor(sim.info(), engine=engine)
    for f in sim.frames(480):
        mon.ingest(f)
    # the rules spoke (an idle GPU, or a rank waiting for a straggler on another host, has nothing to say)
    assert said or mix in ("idle", "collective_wait")
    wrong = [(rule, f.subject, why, f.evidence) for rule, f in said if f.state == HOLDS
             for why in _contradictions(rule, f.evidence)]
    assert not wrong
