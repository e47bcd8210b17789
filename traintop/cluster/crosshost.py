"""Cross-host rules: what only a view over every host and rank of a job can see.

Each rule is judged at every instant of the grid; an instant-by-instant verdict becomes a
finding once it has held for ``HOLD_S`` (gaps of up to two steps bridged), as the local
rules' hysteresis does. The evidence names the numbers, and for a lagging rank or node
says why from that host's own data (its input wait, its clocks, its agent's findings).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from traintop.cluster.fetch import ClusterData, RankData
from traintop.samples import reason_names

HOLD_S = 10.0
STRAGGLER_RATIO = 1.25  # step time this much above the job's median
INPUT_WAIT_HIGH = 0.2
# Synchronous DDP: every rank steps at the straggler's pace, so a rank's input wait times the
# common step time is its loader's time a step. The straggler's loader takes this share of the
# step more than the others' median (the share they spend waiting for it in collectives), and
# at least WAIT_RATIO times as much. An absolute gap, not only a ratio: on an H200 the others'
# own loader took 35 % of the step (building a batch on the CPU) while the straggler's took 88 %.
WAIT_GAP = 0.2
WAIT_RATIO = 1.5
NODE_STARVING = 0.3  # a node's mean input wait, while the other nodes' median stays under
OTHERS_FACTOR = 2.5  # ... at least this many times the other nodes' median
CLOCK_LOW = 0.85  # every busy GPU of a node below this share of its maximum SM clock
CLOCK_NORMAL = 0.95  # while the other nodes' median stays at or above it
BUSY = 0.5


@dataclass(frozen=True)
class CrossRule:
    id: str
    title: str
    severity: str
    remedies: tuple[str, ...]


STRAGGLER = CrossRule("straggler", "Straggler rank", "warning", (
    "Look at the lagging rank's host: its input pipeline, its GPU clocks, other processes on it.",
    "If its loader starves: more DataLoader workers on that node, or a local copy of the data.",
    "Exclude a persistently slow node from the allocation (Slurm --exclude) and report it.",
))
STRAGGLER_NODE = CrossRule("straggler_node", "Straggler node", "warning", STRAGGLER.remedies)
STALLED = CrossRule("stalled_job", "Job stalled", "critical", (
    "Dump the ranks' stacks (py-spy dump --pid) to see where they wait: usually a collective.",
    "Set NCCL_DEBUG=INFO and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 so a hang becomes an error.",
    "Check for a dead or missing rank (a node that stopped reporting).",
))
NODE_STARVING_RULE = CrossRule("node_starving", "One node's loader starves the job", "warning", (
    "Compare that node's storage and CPU with the others (a slower mount, fewer cores, a busy neighbour).",
    "Raise DataLoader num_workers on that node, or stage the data on its local disk.",
))
SLOW_NODE = CrossRule("slow_node", "Slow node: all its GPUs clocked down", "warning", (
    "Check that node's cooling and power (nvidia-smi -q -d PERFORMANCE shows why clocks are held).",
    "Drain it for maintenance if it persists: the whole job runs at its pace.",
))
NODE_GPU_ERRORS = CrossRule("node_gpu_errors", "GPU errors on a node", "critical", (
    "Read the node's kernel log for the XID (dmesg | grep -i xid).",
    "Drain the node (scontrol update nodename=… state=drain) before the job is restarted on it.",
))
NODE_MISSING = CrossRule("node_missing", "Node stopped reporting", "critical", (
    "Check whether the node and its agent are alive (a crash, a reboot, the network).",
    "A training job that lost a node usually hangs in its next collective: check the job too.",
))
HOST_CLAIMED = CrossRule("host_claimed_twice", "Two sources claim one host", "warning", (
    "See which scrape targets send this Hostname: count by (instance) (traintop_agent_info{Hostname=\"…\"}).",
    "Stop the agent that should not speak for this host, or give each agent its own --hostname.",
    "Scrape agents without honor_labels (docs/CLUSTER.md): a target then cannot choose its own instance label.",
))
RANK_CLAIMED = CrossRule("rank_claimed_twice", "One rank claimed twice", "warning", (
    "Find the processes on the hosts named (traintop --pid, or ps on that host) and the users that own them.",
    "A rank claimed by another user's process is someone posing as the job: report it to the cluster's admins.",
    "Two runs of one job id at once (a restart before the old run ended) claim every rank twice: stop the old one.",
))
RANK_OWNERS = CrossRule("rank_owners_differ", "A job's ranks run as different users", "warning", (
    "A job's ranks on one host normally belong to one user: find the rank that does not and who started it.",
    "Until then, its figures are that user's word, not the job's.",
))
RULES = {r.id: r for r in (STRAGGLER, STRAGGLER_NODE, STALLED, NODE_STARVING_RULE, SLOW_NODE, NODE_GPU_ERRORS,
                           NODE_MISSING, HOST_CLAIMED, RANK_CLAIMED, RANK_OWNERS)}


@dataclass
class CrossFinding:
    rule: CrossRule
    host: str
    subject: str
    start: float
    end: float
    evidence: str
    job: str | None = None
    ranks: tuple[int, ...] = ()  # the lagging ranks (straggler findings): what the others wait for


def _intervals(times: list[float], step: float, hold: float = HOLD_S) -> list[tuple[float, float]]:
    out = []
    for t in sorted(times):
        if out and t - out[-1][1] <= 2.5 * step:
            out[-1][1] = t
        else:
            out.append([t, t])
    return [(a, b) for a, b in out if b - a + step >= hold]


def _mean(vals) -> float | None:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _between(d: dict, a: float, b: float) -> list[float]:
    return [v for t, v in d.items() if a <= t <= b]


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f} %"


def _why(data: ClusterData, host: str, ranks: list[RankData], a: float, b: float, others: list[RankData]) -> str:
    """Why a rank or node lags, from its host's own series."""
    parts = []
    wait = _mean(v for r in ranks for v in _between(r.wait, a, b))
    other_wait = _per_rank_means(data, others, a, b, "wait")
    if wait is not None and wait >= INPUT_WAIT_HIGH:
        parts.append(f"input wait {_pct(wait)}"
                     + (f" (the other ranks' median {_pct(statistics.median(other_wait))})" if other_wait else ""))
    cpu = _mean(_between(data.loader_cpu.get(host, {}), a, b))
    if cpu is not None and wait is not None and wait >= INPUT_WAIT_HIGH:
        parts.append(f"loader workers at {cpu * 100:.0f} % CPU")
    for r in ranks:
        g = data.gpus.get((host, r.local_rank))
        if g is None:
            continue
        clk = _mean(_between(g.clock_ratio, a, b))
        if clk is not None and clk < CLOCK_LOW:
            reasons = sorted({n for v in _between(g.reasons, a, b) for n in reason_names(int(v))} - {"idle"})
            parts.append(f"GPU {g.index} clocked at {_pct(clk)} of max" + (f" ({', '.join(reasons)})" if reasons else ""))
    titles = sorted({title for title, t0, t1 in _host_findings(data).get(host, ()) if t0 <= b and t1 >= a})
    if titles:
        parts.append(f"{host}'s agent reports {', '.join(titles)}")
    return "; why, from " + host + ": " + "; ".join(parts) if parts else f"; {host}'s own series show no cause"


def _host_findings(data: ClusterData) -> dict:
    """host -> [(title, first, last)] of its agent's warnings, built once per read."""
    cached = getattr(data, "_by_host", None)
    if cached is None:
        from traintop.rules import default_rules

        names = {r.id: r.title for r in default_rules()}
        cached = {}
        for f in data.findings:
            if f.severity in ("warning", "critical") and f.times:
                cached.setdefault(f.host, []).append((names.get(f.rule, f.rule), f.times[0], f.times[-1]))
        data._by_host = cached
    return cached


def stragglers(data: ClusterData) -> list[CrossFinding]:
    out = []
    for job, ranks in data.jobs().items():
        if len(ranks) < 2:
            continue
        lag: dict[int, list[float]] = {r.rank: [] for r in ranks}
        for t in data.grid:
            steps = {r.rank: r.step.get(t) for r in ranks if r.step.get(t)}
            waits = {r.rank: r.wait.get(t) for r in ranks if r.wait.get(t) is not None}
            if len(steps) >= 2:
                m = _reference(steps.values())
                for rk, s in steps.items():
                    if s >= STRAGGLER_RATIO * m and s - m >= 0.005:
                        lag[rk].append(t)
                if max(steps.values()) < STRAGGLER_RATIO * m and len(waits) >= 2:
                    # synchronous DDP: equal step times; the rank the others wait for waits for its data
                    for rk in _waiting_for_input(waits):
                        lag[rk].append(t)
        by_rank = {r.rank: r for r in ranks}
        lagging_hosts: dict[str, list[RankData]] = {}
        for rk, times in lag.items():
            for a, b in _intervals(times, data.step):
                lagging_hosts.setdefault(by_rank[rk].host, []).append((by_rank[rk], a, b))
        n_hosts = len({r.host for r in ranks})
        for host, items in lagging_hosts.items():
            host_ranks = [r for r in ranks if r.host == host]
            others = [r for r in ranks if r.host != host]
            lagging = {r.rank for r, _, _ in items}
            if len(host_ranks) > 1 and lagging == {r.rank for r in host_ranks} and n_hosts > 1:
                a, b = min(x[1] for x in items), max(x[2] for x in items)
                own = _mean(v for r in host_ranks for v in _between(r.step, a, b))
                med = _median_step(others, a, b, data)
                head = (f"all {len(host_ranks)} ranks on {host} lag: {_fmt(own)} a step vs {_fmt(med)} on the other "
                        f"{len(others)} ranks of job {job}")
                waiters = ""
                if _in_step(own, med):
                    head = (f"all {len(host_ranks)} ranks on {host} hold job {job} back: every rank steps at their "
                            f"pace ({_fmt(own)} a step) and {_others_wait(len(others))} for them in collectives")
                    waiters = _waiters(data, others, a, b)
                out.append(CrossFinding(STRAGGLER_NODE, host, f"job {job}", a, b,
                                        head + _why(data, host, host_ranks, a, b, others) + waiters,
                                        job, tuple(sorted(lagging))))
                continue
            for r, a, b in items:
                own = _mean(_between(r.step, a, b))
                rest = [x for x in ranks if x.rank != r.rank]
                med = _median_step(rest, a, b, data)
                waiters = ""
                if _in_step(own, med):  # synchronous: the lag shows in what the ranks wait for, not the step time
                    head = (f"rank {r.rank} of job {job} on {host} holds the job back: every rank steps at its pace "
                            f"({_fmt(own)} a step) and {_others_wait(len(rest))} for it in collectives")
                    waiters = _waiters(data, rest, a, b)
                else:
                    head = (f"rank {r.rank} of job {job} on {host}: {_fmt(own)} a step vs a median of "
                            f"{_fmt(med)} over the other {len(rest)} ranks")
                out.append(CrossFinding(STRAGGLER, host, f"job {job} rank {r.rank}", a, b,
                                        head + _why(data, host, [r], a, b, rest) + waiters, job, (r.rank,)))
    return out


def _others_wait(n: int) -> str:
    return "the other rank waits" if n == 1 else f"the other {n} ranks wait"


def _gpu_states(data: ClusterData, ranks: list[RankData], a: float, b: float) -> list:
    states = []
    for r in ranks:
        g = data.gpus.get((r.host, r.local_rank))
        if g is None:
            continue
        u, p = _mean(_between(g.util, a, b)), _mean(_between(g.power, a, b))
        if u is not None:
            states.append((r, g, u, p))
    return states


def _in_step(own: float | None, med: float | None) -> bool:
    return own is not None and med is not None and own < STRAGGLER_RATIO * med


def _waiters(data: ClusterData, rest: list[RankData], a: float, b: float) -> str:
    """What the waiting ranks' GPUs do meanwhile: busy by utilization at little power is a collective's
    spin, not work (rules/collective.py)."""
    if len(rest) > EXACT_UP_TO:  # a large job: the job's figure for the interval, computed once
        cache = data.__dict__.setdefault("_interval_means", {})
        key = (rest[0].job, a, b, "waiters")
        if key not in cache:
            cache[key] = _gpu_states(data, [r for r in data.ranks.values() if r.job == rest[0].job], a, b)
        states = cache[key]
    else:
        states = _gpu_states(data, rest, a, b)
    if not states:
        return ""
    if len(states) <= 3:
        shown = ", ".join(f"{r.host} GPU {g.index} {_pct(u)} busy"
                          + (f" at {p:.0f} W" + (f" of {g.power_limit:.0f} W" if g.power_limit else "") if p else "")
                          for r, g, u, p in states)
    else:
        powers = [p for *_, p in states if p is not None]
        shown = (f"their {len(states)} GPUs {_pct(statistics.median(u for *_, u, _ in states))} busy (median)"
                 + (f" at {statistics.median(powers):.0f} W" if powers else ""))
    return f"; meanwhile the others' GPUs: {shown}"


def _waiting_for_input(waits: dict) -> list:
    """Ranks whose input wait is high and ``WAIT_GAP`` above (and ``WAIT_RATIO`` times) the others' median. The median of
    the others is the median of all but one value: computed from the sorted list in O(1) per
    rank, not by rebuilding it (10 000 ranks × 720 instants)."""
    vals = sorted(waits.values())
    n = len(vals)
    out = []
    for rk, w in waits.items():
        if w < INPUT_WAIT_HIGH:
            continue
        # the median of vals without one copy of w
        i = vals.index(w) if n < 64 else _bisect_index(vals, w)
        rest_mid = _median_without(vals, i)
        if w - rest_mid >= WAIT_GAP and w >= WAIT_RATIO * rest_mid:
            out.append(rk)
    return out


def _bisect_index(vals, w):
    import bisect

    return bisect.bisect_left(vals, w)


def _median_without(vals: list, i: int) -> float:
    n = len(vals) - 1
    def at(k):  # the k-th value of vals with index i removed
        return vals[k] if k < i else vals[k + 1]
    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _reference(values) -> float:
    """The pace of the job's unhindered ranks: the median of the fastest third, so that slow
    nodes holding many of the ranks do not drag the yardstick towards themselves."""
    vals = sorted(values)
    return statistics.median(vals[: max(1, len(vals) // 3)])


def _median_step(ranks, a, b, data=None):
    vals = _per_rank_means(data, ranks, a, b, "step") if data is not None else \
        [v for r in ranks for v in _between(r.step, a, b)]
    return statistics.median(vals) if vals else None


EXACT_UP_TO = 32  # ranks; beyond, a job-wide figure (computed once per interval) stands for "the others"


def _per_rank_means(data, ranks: list[RankData], a: float, b: float, attr: str) -> list[float]:
    """Each rank's mean of ``attr`` over [a, b]. For a large job the same interval is asked about
    for many lagging ranks: the means of every rank of the job are computed once per interval,
    and "the others" are all of them (one rank more or less does not move a median of hundreds)."""
    if len(ranks) <= EXACT_UP_TO:
        vals = [_mean(_between(getattr(r, attr), a, b)) for r in ranks]
        return [v for v in vals if v is not None]
    cache = data.__dict__.setdefault("_interval_means", {})
    job = ranks[0].job
    key = (job, a, b, attr)
    if key not in cache:
        vals = [_mean(_between(getattr(r, attr), a, b)) for r in data.ranks.values() if r.job == job]
        cache[key] = [v for v in vals if v is not None]
    return cache[key]


def _fmt(v):
    return "–" if v is None else f"{v:.3g} s"


def stalled(data: ClusterData) -> list[CrossFinding]:
    out = []
    window = max(10.0, min(60.0, 10 * data.step))
    for job, ranks in data.jobs().items():
        times = []
        for t in data.grid:
            before = round(t - window, 3)
            flat = []
            for r in ranks:
                now, then = r.steps.get(t), r.steps.get(before)
                if now is None or then is None:
                    continue
                flat.append(now - then <= 0)
            if flat and all(flat) and len(flat) == len([r for r in ranks if r.steps.get(t) is not None]):
                times.append(t)
        for a, b in _intervals(times, data.step):
            hosts = sorted({r.host for r in ranks})
            util = _mean(v for (h, _), g in data.gpus.items() if h in hosts for v in _between(g.util, a, b))
            out.append(CrossFinding(STALLED, ",".join(hosts[:3]) + ("…" if len(hosts) > 3 else ""), f"job {job}",
                                    a - window, b,
                                    f"no rank of job {job} took a step for {b - a + window:.0f} s "
                                    f"({len(ranks)} ranks on {len(hosts)} node(s)); their GPUs meanwhile: "
                                    f"utilization {_pct(util)}"
                                    + (" (a hung collective keeps GPUs busy)" if util is not None and util > 0.8 else ""),
                                    job))
    return out


def node_starving(data: ClusterData) -> list[CrossFinding]:
    out = []
    for job, ranks in data.jobs().items():
        hosts = sorted({r.host for r in ranks})
        if len(hosts) < 2:
            continue
        hit: dict[str, list[float]] = {h: [] for h in hosts}
        by_host = {h: [r for r in ranks if r.host == h] for h in hosts}
        for t in data.grid:
            per = {h: _mean(r.wait.get(t) for r in by_host[h]) for h in hosts}
            per = {h: w for h, w in per.items() if w is not None}
            if len(per) < 2:
                continue
            vals = sorted(per.values())
            for h, w in per.items():
                if w >= NODE_STARVING and w >= OTHERS_FACTOR * _median_without(vals, _bisect_index(vals, w)):
                    hit[h].append(t)
        for h, times in hit.items():
            for a, b in _intervals(times, data.step):
                mine = [r for r in ranks if r.host == h]
                others = [r for r in ranks if r.host != h]
                w = _mean(v for r in mine for v in _between(r.wait, a, b))
                ow = _mean(v for r in others for v in _between(r.wait, a, b))
                cpu = _mean(_between(data.loader_cpu.get(h, {}), a, b))
                out.append(CrossFinding(NODE_STARVING_RULE, h, f"job {job}", a, b,
                                        f"the {len(mine)} rank(s) on {h} wait for input {_pct(w)} of the time, the "
                                        f"other {len(hosts) - 1} node(s) {_pct(ow)}"
                                        + (f"; {h}'s loader workers at {cpu * 100:.0f} % CPU" if cpu is not None else ""),
                                        job))
    return out


def slow_nodes(data: ClusterData) -> list[CrossFinding]:
    hosts = sorted({h for h, _ in data.gpus})
    if len(hosts) < 2:
        return []
    hit: dict[str, list[float]] = {h: [] for h in hosts}
    by_host = {h: [g for (gh, _), g in data.gpus.items() if gh == h] for h in hosts}
    for t in data.grid:
        per = {}
        for h in hosts:
            ratios = [g.clock_ratio.get(t) for g in by_host[h]
                      if (g.util.get(t) or 0) >= BUSY and g.clock_ratio.get(t) is not None]
            if ratios:
                per[h] = max(ratios)  # every busy GPU below the line: the highest of them is
        if len(per) < 2:
            continue
        vals = sorted(per.values())
        for h, top in per.items():
            if top < CLOCK_LOW and _median_without(vals, _bisect_index(vals, top)) >= CLOCK_NORMAL:
                hit[h].append(t)
    out = []
    for h, times in hit.items():
        for a, b in _intervals(times, data.step):
            gpus = [g for (gh, _), g in sorted(data.gpus.items()) if gh == h]
            clk = _mean(v for g in gpus for v in _between(g.clock_ratio, a, b))
            temp = max((v for g in gpus for v in _between(g.temp, a, b)), default=None)
            reasons = sorted({n for g in gpus for v in _between(g.reasons, a, b) for n in reason_names(int(v))}
                             - {"idle"})
            out.append(CrossFinding(SLOW_NODE, h, h, a, b,
                                    f"all {len(gpus)} GPUs of {h} run at {_pct(clk)} of their maximum SM clock while "
                                    f"the other nodes' stay at full clock"
                                    + (f"; peak {temp:.0f} °C" if temp is not None else "")
                                    + (f"; clock-event reasons: {', '.join(reasons)}" if reasons else "")))
    return out


def gpu_errors(data: ClusterData) -> list[CrossFinding]:
    out = []
    for h in sorted({h for h, _ in data.gpus}):
        bad = []
        first = last = None
        for (gh, i), g in sorted(data.gpus.items()):
            if gh != h:
                continue
            events = []
            for series, label in ((g.xid_total, "XID"), (g.ecc_uncorrected, "uncorrectable ECC")):
                pts = sorted(series.items())
                for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
                    if v1 > v0:
                        events.append((t1, label))
            if events:
                codes = sorted({int(v) for v in g.last_xid.values() if v})
                bad.append(f"GPU {i}: {len(events)} new " + ", ".join(sorted({lbl for _, lbl in events}))
                           + (f" (XID {', '.join(map(str, codes))})" if codes else ""))
                ts = [t for t, _ in events]
                first = min(ts + ([first] if first else []))
                last = max(ts + ([last] if last else []))
        if bad:
            out.append(CrossFinding(NODE_GPU_ERRORS, h, h, first, last, f"{h}: " + "; ".join(bad)))
    return out


def last_seen(data: ClusterData) -> dict[str, float]:
    """Each host's newest sample in the window (its GPUs' utilization, its ranks' step counts)."""
    seen: dict[str, float] = {}
    for (h, _), g in data.gpus.items():
        if g.util:
            seen[h] = max(seen.get(h, 0.0), max(g.util))
    for r in data.ranks.values():
        if r.steps:
            seen[r.host] = max(seen.get(r.host, 0.0), max(r.steps))
    return seen


def silent_hosts(data: ClusterData) -> dict[str, float]:
    """Hosts whose series stopped: seconds since each one's last sample. Stopped while others go
    on (as `missing_nodes` judges), or, where every host stopped, long before the window's end."""
    seen = last_seen(data)
    if not seen:
        return {}
    newest = max(seen.values())
    gap = max(3 * data.step, 5.0)
    return {h: data.end - t for h, t in seen.items()
            if newest - t > gap or data.end - t > max(6 * data.step, 60.0)}


def missing_nodes(data: ClusterData) -> list[CrossFinding]:
    """A node whose series stopped while the others' went on."""
    last_seen_ = last_seen(data)
    if len(last_seen_) < 2:
        return []
    newest = max(last_seen_.values())
    gap = max(3 * data.step, 5.0)
    out = []
    for h, t in sorted(last_seen_.items()):
        if newest - t > gap:
            jobs = sorted({r.job for r in data.ranks.values() if r.host == h})
            out.append(CrossFinding(NODE_MISSING, h, h, t, newest,
                                    f"{h}'s series stopped at its last sample while the other nodes' go on "
                                    f"({newest - t:.0f} s without it)"
                                    + (f"; it ran ranks of job {', '.join(jobs)}" if jobs else "")))
    return out


def claimed_twice(data: ClusterData) -> list[CrossFinding]:
    """Two sources for one host, one rank claimed twice, a job's ranks owned by different users (claims.py)."""
    return [CrossFinding(RULES[c.rule], c.host, c.subject, c.start, c.end, c.evidence, c.job)
            for c in data.conflicts]


ALL = (stragglers, stalled, node_starving, slow_nodes, gpu_errors, missing_nodes, claimed_twice)


def evaluate(data: ClusterData) -> list[CrossFinding]:
    out = []
    for rule in ALL:
        out.extend(rule(data))
    return _fold_node_starving(out)


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _fold_node_starving(found: list[CrossFinding]) -> list[CrossFinding]:
    """A node whose loader starves the job and the straggler (rank or node) it makes are one finding:
    the straggler's, which names the rank and carries the cause. "One node's loader starves the
    job" stays for a node whose ranks starve without one standing out as the job's straggler."""
    lagging = [f for f in found if f.rule in (STRAGGLER, STRAGGLER_NODE)]
    return [f for f in found if f.rule is not NODE_STARVING_RULE
            or not any(s.host == f.host and s.job == f.job and (overlap(s.start, s.end, f.start, f.end) > 0
                                                                  or s.start <= f.start <= s.end)
                       for s in lagging)]
