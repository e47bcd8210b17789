"""Cross-host rules on a cluster's series laid on one time grid (as analyze --prometheus reads them)."""

from traintop.cluster import crosshost
from traintop.cluster.fetch import ClusterData, GpuData, RankData
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
    return {(f.rule.id, f.host, f.subject) for f in findings}


def test_a_synchronous_job_waits_for_the_rank_that_waits_for_its_data():
    d = grid_data()
    job(d, wait=lambda h, local, t: 0.4 if (h, local) == ("n2", 1) else 0.02)  # equal step times (DDP)
    assert rules_of(crosshost.stragglers(d)) == {("straggler", "n2", "job 7 rank 3")}


def test_no_straggler_in_a_healthy_job_with_noise():
    d = grid_data()
    job(d, step_time=lambda h, local, t: 0.08 * (1 + 0.05 * ((t + local) % 3)))
    assert crosshost.stragglers(d) == []


def test_a_job_whose_step_counters_stay_flat_is_stalled_and_only_after_holding():
    d = grid_data(60)
    job(d, steps=lambda h, local, t: min(t, 30.0) * 10)  # every rank stops at t = 30
    (f,) = crosshost.stalled(d)
    assert f.rule.id == "stalled_job" and f.subject == "job 7"
    assert f.start >= 30 - 1 and "no rank of job 7 took a step" in f.evidence
    d2 = grid_data(60)
    job(d2, steps=lambda h, local, t: (min(t, 30.0) if (h, local) != ("n1", 0) else t) * 10)
    assert crosshost.stalled(d2) == []  # one rank still steps: not stalled


def test_a_node_with_every_gpu_clocked_down_is_slow_and_says_why():
    d = grid_data()
    job(d, hosts=("n1", "n2", "n3"))
    for (h, _), g in d.gpus.items():
        if h == "n3":
            for t in d.grid:
                g.clock_ratio[t], g.reasons[t], g.temp[t] = 0.72, REASON_SW_THERMAL, 86.0
    (f,) = crosshost.slow_nodes(d)
    assert (f.rule.id, f.host) == ("slow_node", "n3")
    assert "72 %" in f.evidence and "SW thermal" in f.evidence and "86 °C" in f.evidence
    d.gpus[("n3", 1)].clock_ratio = {t: 1.0 for t in d.grid}  # one GPU at full clock: not the node
    assert crosshost.slow_nodes(d) == []


def test_new_xids_on_a_node_are_errors_and_old_counts_are_not():
    d = grid_data()
    job(d)
    g = d.gpus[("n2", 1)]
    g.xid_total = {t: 3.0 for t in d.grid}  # counted before the range
    assert crosshost.gpu_errors(d) == []
    g.xid_total = {t: 3.0 if t < 20 else 4.0 for t in d.grid}
    g.last_xid = {t: 79.0 for t in d.grid}
    (f,) = crosshost.gpu_errors(d)
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
    (f,) = crosshost.missing_nodes(d)
    assert (f.rule.id, f.host, f.start) == ("node_missing", "n2", 39.0)
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
    assert "every rank steps at its pace" in ev and "wait for it in collectives" in ev
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
    assert rules_of(crosshost.evaluate(d)) == {("node_starving", "n2", "job 7"), ("straggler", "n3", "job 7 rank 5")}
    d2 = h200_ddp()
    d2.ranks[("7", 0)].wait = {t: 0.3 for t in d2.grid}  # the other node waits 2.9 times less: node_starving holds
    assert "node_starving" not in {f.rule.id for f in crosshost.evaluate(d2)}  # folded into the straggler
    assert {f.rule.id for f in crosshost.node_starving(d2)} == {"node_starving"}
