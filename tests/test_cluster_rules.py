"""Cross-host rules on a cluster's series laid on one time grid (as analyze --prometheus reads them)."""

import pytest

from traintop.cluster.judge import judge
from traintop.rules.across import NodeStarving, SlowNode, Stalled, Straggler, StragglerNode
from traintop.cluster.fetch import ClusterData, GpuData, RankData
from traintop.findings import Severity
from traintop.samples import REASON_SW_THERMAL


def grid_data(n=60, step=1.0):
    return ClusterData("test", 0.0, (n - 1) * step, step, [float(k) * step for k in range(n)])


def job(data, hosts=("n1", "n2"), per_host=2, step_time=lambda host, local, t: 0.08, steps=None, wait=None):
    for h_i, h in enumerate(hosts):
        for local in range(per_host):
            rank = h_i * per_host + local
            r = data.ranks[("7", rank)] = RankData("7", rank, local, len(hosts) * per_host, h)
            for t in data.grid:
                r.step[t] = step_time(h, local, t)
                r.steps[t] = steps(h, local, t) if steps else t * 10
                r.wait[t] = wait(h, local, t) if wait else 0.02
            g = data.gpus[(h, local)] = GpuData(h, local, "NVIDIA H200")
            for t in data.grid:
                g.util[t], g.clock_ratio[t] = 1.0, 1.0


def rules_of(findings):
    return {(f.rule, f.host, f.subject) for f in findings}


def stragglers(d, config=None):
    return judge(d, *([config] if config else []), rules=(Straggler, StragglerNode), events=())


def stalled(d):
    return judge(d, rules=(Stalled,), events=())


def slow_nodes(d, config=None):
    return judge(d, *([config] if config else []), rules=(SlowNode,), events=())


def node_starving(d):
    return judge(d, rules=(NodeStarving,), events=())


def gpu_errors(d):
    return judge(d, rules=(), events=("node_gpu_errors",))


def missing_nodes(d):
    return judge(d, rules=(), events=("node_missing",))


def test_a_synchronous_job_waits_for_the_rank_that_waits_for_its_data():
    d = grid_data()
    job(d, wait=lambda h, local, t: 0.4 if (h, local) == ("n2", 1) else 0.02)  # equal step times (DDP)
    assert rules_of(stragglers(d)) == {("straggler", "n2", "job 7 rank 3")}


def test_no_straggler_in_a_healthy_job_with_noise():
    d = grid_data()
    job(d, step_time=lambda h, local, t: 0.08 * (1 + 0.05 * ((t + local) % 3)))
    assert stragglers(d) == []


def test_a_job_whose_step_counters_stay_flat_is_stalled_and_only_after_holding():
    d = grid_data(60)
    job(d, steps=lambda h, local, t: min(t, 30.0) * 10)  # every rank stops at t = 30
    (f,) = stalled(d)
    assert f.rule == "stalled_job" and f.subject == "job 7"
    assert f.start >= 30 - 1 and "no rank of job 7 took a step" in f.evidence
    d2 = grid_data(60)
    job(d2, steps=lambda h, local, t: (min(t, 30.0) if (h, local) != ("n1", 0) else t) * 10)
    assert stalled(d2) == []  # one rank still steps: not stalled


def test_a_node_with_every_gpu_clocked_down_is_slow_and_says_why():
    d = grid_data()
    job(d, hosts=("n1", "n2", "n3"))
    for (h, _), g in d.gpus.items():
        if h == "n3":
            for t in d.grid:
                g.clock_ratio[t], g.reasons[t], g.temp[t] = 0.72, REASON_SW_THERMAL, 86.0
    (f,) = slow_nodes(d)
    assert (f.rule, f.host) == ("slow_node", "n3")
    assert "72 %" in f.evidence and "SW thermal" in f.evidence and "86 °C" in f.evidence
    d.gpus[("n3", 1)].clock_ratio = {t: 1.0 for t in d.grid}  # one GPU at full clock: not the node
    assert slow_nodes(d) == []


def test_new_xids_on_a_node_are_errors_and_old_counts_are_not():
    d = grid_data()
    job(d)
    g = d.gpus[("n2", 1)]
    g.xid_total = {t: 3.0 for t in d.grid}  # counted before the range
    assert gpu_errors(d) == []
    g.xid_total = {t: 3.0 if t < 20 else 4.0 for t in d.grid}
    g.last_xid = {t: 79.0 for t in d.grid}
    (f,) = gpu_errors(d)
    assert f.host == "n2" and "GPU 1" in f.evidence and "XID 79" in f.evidence and f.start == 20


def test_a_node_whose_series_stop_is_missing():
    d = grid_data()
    job(d, hosts=("n1", "n2", "n3"))
    for (h, _), g in d.gpus.items():
        if h == "n2":
            g.util = {t: v for t, v in g.util.items() if t < 40}
    for r in d.ranks.values():
        if r.host == "n2":
            r.steps = {t: v for t, v in r.steps.items() if t < 40}
    (f,) = missing_nodes(d)
    assert (f.rule, f.host, f.start) == ("node_missing", "n2", 39.0)
    assert "job 7" in f.evidence


def h200_ddp(n=60):
    """The shape two H200s showed (one rank per node, a synchronous job): rank 1's loader takes
    87 % of the step, rank 0's own loader 35 % (building its batch on the CPU) and the rest of
    rank 0's step is the wait for rank 1 in the all-reduce; equal step times. Each node's agent
    raised data starvation on its GPU: true for rank 1's, not for rank 0's."""
    from traintop.cluster.fetch import AgentFinding

    d = grid_data(n)
    job(d, hosts=("h200-node0", "h200-node1"), per_host=1, step_time=lambda h, local, t: 0.055 + 0.001 * (t % 3),
        wait=lambda h, local, t: 0.87 if h == "h200-node1" else 0.35)
    for (h, _), g in d.gpus.items():
        g.power_limit = 700.0
        for t in d.grid:
            g.util[t] = 0.07 if h == "h200-node1" else 0.58
            g.power[t] = 170.0
    d.findings += [AgentFinding("h200-node1", "starvation", "warning", "gpu0", list(d.grid[15:])),
                   AgentFinding("h200-node0", "starvation", "warning", "gpu0", list(d.grid[30:]))]
    return d


def test_the_h200_straggler_is_one_finding_naming_the_rank_and_why():
    from traintop.cluster.report import findings_of

    d = h200_ddp()
    shown, explained = findings_of(d)
    assert [(f.rule, f.host, f.subject) for f in shown] == [("straggler", "h200-node1", "job 7 rank 1")]
    ev = shown[0].evidence
    assert "every rank steps at its pace" in ev and "the other rank waits for it in collectives" in ev
    assert "input wait 87 %" in ev and "median 35 %" in ev  # why: its loader, against the others'
    assert "h200-node0 GPU 0 58 % busy at 170 W of 700 W" in ev  # what the waiting rank's GPU does
    # both agents' starvation verdicts are explained, not shown: rank 0's was wrong, rank 1's is the cause
    assert {(f.host, f.rule) for f in explained} == {("h200-node0", "starvation"), ("h200-node1", "starvation")}
    by_host = {f.host: f.explained_by for f in explained}
    assert "waits in its collectives for job 7 rank 1 on h200-node1" in by_host["h200-node0"]
    assert "the cause of" in by_host["h200-node1"]


def test_a_starving_node_that_is_no_straggler_keeps_its_own_finding():
    # not lock-step: n3's rank 5 is slower by its step time, n2's ranks wait for input 60 % of the
    # time at the common pace. n2 is no straggler by step time; its loader starves all the same.
    d = grid_data()
    job(d, hosts=("n1", "n2", "n3"), step_time=lambda h, local, t: 0.2 if (h, local) == ("n3", 1) else 0.08,
        wait=lambda h, local, t: 0.6 if h == "n2" else 0.02)
    assert rules_of(judge(d)) == {("node_starving", "n2", "job 7"), ("straggler", "n3", "job 7 rank 5")}
    d2 = h200_ddp()
    d2.ranks[("7", 0)].wait = {t: 0.3 for t in d2.grid}  # the other node waits 2.9 times less: node_starving holds
    assert "node_starving" not in {f.rule for f in judge(d2)}  # folded into the straggler
    assert {f.rule for f in node_starving(d2)} == {"node_starving"}


def from_recordings(paths: dict, job: str = "h200-ddp", step: float = 1.0):
    """What Prometheus would hold of agents' recordings: each sample on a ``step`` grid (the last
    one at or before each instant), each agent's alerts as the instants they were active."""
    from traintop.cluster.fetch import AgentFinding
    from traintop.record.recording import RecordingReader

    read = {h: RecordingReader(str(p)) for h, p in paths.items()}
    frames = {h: list(r.frames()) for h, r in read.items()}
    t0 = max(fs[0].t for fs in frames.values())
    t1 = min(fs[-1].t for fs in frames.values())
    grid = [t0 + k * step for k in range(int((t1 - t0) / step) + 1)]
    d = ClusterData("recordings", t0, grid[-1], step, grid)
    # a rank starting up may show on another GPU for a moment (before torch.cuda.set_device):
    # it belongs to the host that saw it most
    seen: dict = {}
    for h, fs in frames.items():
        for f in fs:
            for r in f.ranks:
                seen.setdefault(r.rank, {}).setdefault(h, 0)
                seen[r.rank][h] += 1
    home = {rank: max(hosts, key=hosts.get) for rank, hosts in seen.items()}
    for h, fs in frames.items():
        k = 0
        for t in grid:
            while k + 1 < len(fs) and fs[k + 1].t <= t:
                k += 1
            f = fs[k]
            for g in f.gpus:
                gd = d.gpus.setdefault((h, g.index), GpuData(h, g.index, "NVIDIA H200", power_limit=g.power_limit_w))
                gd.util[t], gd.power[t] = g.util / 100, g.power_w
                gd.clock_ratio[t] = g.sm_clock / g.sm_clock_max
            for r in f.ranks:
                if home[r.rank] != h:
                    continue
                local = r.local_rank if r.local_rank is not None else r.device
                rd = d.ranks.setdefault((job, r.rank), RankData(job, r.rank, local, r.world_size, h))
                if r.step_time:
                    rd.step[t], rd.steps[t], rd.wait[t] = r.step_time, r.steps, r.input_wait
        for a in read[h].alerts():
            end = a.end if a.end is not None else t1
            d.findings.append(AgentFinding(h, a.rule, a.severity.label, a.subject,
                                           [t for t in grid if a.start <= t <= end]))
    return d


def test_the_h200_agents_recordings_name_rank_1_and_nothing_on_node0():
    """Two H200s, one agent per GPU posing as two nodes, a two-rank DDP job whose rank 1's loader
    sleeps 30 ms a batch: the agents' own recordings, laid on a grid as Prometheus keeps them."""
    import pathlib

    from traintop.cluster.report import findings_of

    fix = pathlib.Path(__file__).parent / "fixtures" / "h200"
    d = from_recordings({"h200-node0": fix / "cluster-node0.ttrec", "h200-node1": fix / "cluster-node1.ttrec"})
    assert {f.host for f in d.findings if f.rule == "starvation"} == {"h200-node0", "h200-node1"}  # as the agents said
    shown, explained = findings_of(d)
    warnings = [(f.rule, f.host, f.subject) for f in shown if f.severity > Severity.INFO]
    assert warnings == [("straggler", "h200-node1", "job h200-ddp rank 1")]
    ev = shown[[f.rule for f in shown].index("straggler")].evidence
    assert "the other rank waits for it in collectives" in ev and "input wait 8" in ev and "h200-node0 GPU 0" in ev
    assert {(f.host, f.rule) for f in explained} == {("h200-node0", "starvation"), ("h200-node1", "starvation")}


def test_a_stalled_job_loses_its_gpus_whole_time_and_gpu_hours_count_the_data_not_the_range():
    from traintop.cluster.report import findings_of, summarise

    d = grid_data(60)
    job(d, steps=lambda h, local, t: min(t, 30.0) * 10)  # the job hangs at 30 s; its GPUs spin at 100 %
    shown, _ = findings_of(d)
    (stall,) = [f for f in shown if f.rule == "stalled_job"]
    assert stall.severity == Severity.CRITICAL and stall.gpu_hours > 0.02  # 4 GPUs × ~30 s, not 0
    report = summarise(d, shown, "prometheus", None)
    assert abs(report.gpu_hours - 4 * 60 / 3600) < 0.01
    # the same minute of data asked over a week at a 1-h step: each GPU's one point is a few scrapes
    week = ClusterData("test", 0.0, 7 * 86400.0, 3600.0, [k * 3600.0 for k in range(169)])
    g = week.gpus[("n1", 0)] = GpuData("n1", 0, "NVIDIA H200")
    g.util[0.0] = 0.1
    assert summarise(week, [], "prometheus", None).gpu_hours < 0.05


def test_a_stalled_job_that_resumes_loses_its_gpus_time_while_it_stalled_not_a_step_more():
    from traintop.cluster.report import findings_of

    d = grid_data(120)
    job(d, steps=lambda h, local, t: (t if t < 30 else 30 if t < 80 else t - 50) * 10)  # hangs 30-80 s
    (stall,) = [f for f in findings_of(d)[0] if f.rule == "stalled_job"]
    # 4 GPUs over its own span (the point after its last, where it no longer held, used to count)
    assert stall.gpu_hours == round(4 * (stall.end - stall.start) / 3600, 4)


def test_a_rank_claimed_twice_leaves_no_older_series_behind_in_the_rolling_window():
    """Two agents both claiming job sim rank 0 (left at their defaults), beside the older series of a
    third source of that rank that stopped: the view's rolling window kept the old one, whose flat
    step counter read as a critical "Job stalled" of a healthy job."""
    from traintop.cluster import claims
    from traintop.cluster.promapi import Grid
    from traintop.cluster.rolling import roll

    old = grid_data(60)
    r = old.ranks[("sim", 0)] = RankData("sim", 0, 0, 1, "vm")
    for t in old.grid:
        r.steps[t], r.step[t] = 500.0, 0.08  # that source stopped long ago: flat
    part = ClusterData("test", 55.0, 65.0, 1.0, [55.0 + k for k in range(11)])
    part.conflicts.append(claims.Conflict(claims.RANK_CLAIMED, "node-a", "job sim rank 0", 55.0, 65.0,
                                          "job sim rank 0 is claimed by node-a and by node-b", "sim"))
    data = roll(old, part, Grid(6.0, 1.0, 60))
    assert ("sim", 0) not in data.ranks
    assert stalled(data) == []


def test_set_of_a_cluster_threshold_changes_the_cross_host_verdict():
    """--set reaches the cross-host rules as it does the local ones: asking for a gap wider than the
    H200 straggler's (87 % against 35 %) leaves no straggler, and each agent's verdict stands."""
    from traintop.cli import parse_args
    from traintop.cluster.report import findings_of
    from traintop.watch.config import describe_thresholds, load_thresholds

    for argv in (["analyze", "--prometheus", "http://127.0.0.1:9"], ["cluster", "--prometheus", "http://127.0.0.1:9"]):
        args = parse_args([*argv, "--set", "cluster_straggler_wait_gap=0.6"])
        assert args.set == ["cluster_straggler_wait_gap=0.6"]
    config = load_thresholds(None, ["cluster_straggler_wait_gap=0.6"])
    assert "cluster_straggler_wait_gap" in describe_thresholds(config, "config.toml")
    shown, explained = findings_of(h200_ddp())
    assert [f.rule for f in shown] == ["straggler"] and len(explained) == 2
    shown, explained = findings_of(h200_ddp(), config)
    assert sorted((f.rule, f.host) for f in shown) == [("starvation", "h200-node0"), ("starvation", "h200-node1")]
    assert explained == []
    # the hold: a straggler all through a minute of data is no finding when a verdict must hold 90 s
    assert not stragglers(h200_ddp(), load_thresholds(None, ["cluster_hold_s=90"]))
    # a node's clocks: 0.72 of max is slow by default, not when slow means below 0.7
    d = grid_data()
    job(d, hosts=("n1", "n2", "n3"))
    for (h, _), g in d.gpus.items():
        if h == "n3":
            g.clock_ratio = {t: 0.72 for t in d.grid}
    assert slow_nodes(d) and not slow_nodes(d, load_thresholds(None, ["cluster_slow_node_clock_frac=0.7"]))


def test_a_cross_host_straggler_costs_the_wait_of_gpus_that_spin_in_nccl():
    """The waiting ranks' GPUs read 100 % (an NCCL kernel spinning), so their agents raise nothing
    for the straggler to fold in: the straggler still costs its GPU's idle share for each other GPU
    of the job in use, once."""
    from traintop.cluster.report import findings_of

    d = grid_data()
    job(d, wait=lambda h, local, t: 0.4 if (h, local) == ("n2", 1) else 0.02)
    for t in d.grid:
        d.gpus[("n2", 1)].util[t] = 0.2  # the straggler's GPU computes 20 % of the time
    shown, explained = findings_of(d)
    assert explained == []
    (s,) = [f for f in shown if f.rule == "straggler"]
    # 3 GPUs wait 80 % of its span
    assert s.gpu_hours == pytest.approx(3 * 0.8 * (s.end - s.start) / 3600, rel=0.1)
