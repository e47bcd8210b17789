"""Judging the cross-host rules (declared in traintop/rules/across_hosts.py) on a cluster's series.

Each rule is judged at every instant of the grid; an instant-by-instant verdict becomes a
finding once it has held for ``cluster_hold_s`` (gaps of up to two steps bridged), as the local
rules' hysteresis does. The evidence names the numbers, and for a lagging rank or node
says why from that host's own data (its input wait, its clocks, its agent's findings). The
thresholds are the ``cluster_*`` fields of ``Thresholds`` (traintop config lists them).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

from traintop.cluster.fetch import ClusterData, RankData
from traintop.rules import HOST, catalogue
from traintop.rules.across_hosts import (CROSS_HOST_RULES, NODE_GPU_ERRORS, NODE_MISSING, NODE_STARVING, SLOW_NODE,
                                         STALLED, STRAGGLER, STRAGGLER_NODE, CrossRule)
from traintop.findings import Finding
from traintop.rules.config import DEFAULT, Thresholds
from traintop.samples import reason_names
from traintop.units import fmt_duration

EXACT_UP_TO = 32  # ranks; beyond, a job-wide figure (computed once per interval) stands for "the others"
MIN_LAG_S = 0.005  # a step this much slower at least: below, timer noise of quick steps
_BY_ID = {r.id: r for r in CROSS_HOST_RULES}
CLUSTER_SCOPE = "cluster"  # a finding only the view over every host can make


@dataclass(frozen=True)
class CrossFinding:
    """A cross-host finding as judged: the one record (``finding``: the host it is about, scope
    "cluster") and what the report needs besides: the declaration it comes from (what it
    explains and defers to), its job and, for a straggler, the lagging ranks."""

    finding: Finding
    rule: CrossRule
    job: str | None = None
    ranks: tuple[int, ...] = ()  # the lagging ranks (straggler findings): what the others wait for

    @property
    def host(self) -> str:
        return self.finding.host or ""

    @property
    def subject(self) -> str:
        return self.finding.subject

    @property
    def start(self) -> float:
        return self.finding.start

    @property
    def end(self) -> float:
        return self.finding.end if self.finding.end is not None else self.finding.start

    @property
    def evidence(self) -> str:
        return self.finding.evidence


def found(rule: CrossRule, host: str, subject: str, start: float, end: float, evidence: str,
          job: str | None = None, ranks: tuple[int, ...] = ()) -> CrossFinding:
    return CrossFinding(Finding(rule.id, rule.title, subject, rule.severity, start, end, evidence,
                                tuple(rule.remedies), host=host, scope=CLUSTER_SCOPE), rule, job, ranks)


@dataclass
class Judging:
    """One judgement of one read: the data, the thresholds, and what several verdicts ask of the
    data (each figure computed once, kept here for this judgement only)."""

    data: ClusterData
    config: Thresholds = DEFAULT
    _interval_means: dict = field(default_factory=dict)  # (job, a, b, what) -> the job's ranks' figures
    _agent_warnings: dict | None = None  # host -> [(title, first, last)] of its agent's warnings

    def agent_warnings(self) -> dict:
        if self._agent_warnings is None:
            names = {r.id: r.title for r in catalogue() if r.scope == HOST}
            found: dict = {}
            for f in self.data.findings:
                if f.severity in ("warning", "critical") and f.times:
                    found.setdefault(f.host, []).append((names.get(f.rule, f.rule), f.times[0], f.times[-1]))
            self._agent_warnings = found
        return self._agent_warnings

    def job_figure(self, job: str, a: float, b: float, what: str, compute):
        key = (job, a, b, what)
        if key not in self._interval_means:
            self._interval_means[key] = compute()
        return self._interval_means[key]

    def intervals(self, times: list[float]) -> list[tuple[float, float]]:
        """The findings' spans: the instants a verdict held, once it has held ``cluster_hold_s``."""
        return spans(times, self.data.step, self.config.cluster_hold_s)


def spans(times: list[float], step: float, hold: float) -> list[tuple[float, float]]:
    """The instants ``times`` as (first, last) runs, gaps of up to two steps bridged; only the runs
    that last ``hold`` seconds at least."""
    out: list[list[float]] = []  # [first, last], the last moved on
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


def _why(j: Judging, host: str, ranks: list[RankData], a: float, b: float, others: list[RankData]) -> str:
    """Why a rank or node lags, from its host's own series."""
    data, c = j.data, j.config
    parts = []
    wait = _mean(v for r in ranks for v in _between(r.wait, a, b))
    other_wait = _per_rank_means(j, others, a, b, "wait")
    high = wait is not None and wait >= c.cluster_straggler_input_wait
    if high:
        parts.append(f"input wait {_pct(wait)}"
                     + (f" (the other ranks' median {_pct(statistics.median(other_wait))})" if other_wait else ""))
    cpu = _mean(_between(data.loader_cpu.get(host, {}), a, b))
    if cpu is not None and high:
        parts.append(f"loader workers at {cpu * 100:.0f} % CPU")
    for r in ranks:
        g = data.gpus.get((host, r.local_rank))
        if g is None:
            continue
        clk = _mean(_between(g.clock_ratio, a, b))
        if clk is not None and clk < c.cluster_slow_node_clock_frac:
            reasons = sorted({n for v in _between(g.reasons, a, b) for n in reason_names(int(v))} - {"idle"})
            parts.append(f"GPU {g.index} clocked at {_pct(clk)} of max" + (f" ({', '.join(reasons)})" if reasons else ""))
    titles = sorted({title for title, t0, t1 in j.agent_warnings().get(host, ()) if t0 <= b and t1 >= a})
    if titles:
        parts.append(f"{host}'s agent reports {', '.join(titles)}")
    return "; why, from " + host + ": " + "; ".join(parts) if parts else f"; {host}'s own series show no cause"


def stragglers(data: ClusterData, config: Thresholds = DEFAULT) -> list[CrossFinding]:
    """A rank (or all of one node's ranks) the others wait for: ``straggler`` and ``straggler_node``."""
    j = Judging(data, config)
    ratio = config.cluster_straggler_ratio
    out: list[CrossFinding] = []
    for job, ranks in data.jobs().items():
        if len(ranks) < 2:
            continue
        lag: dict[int, list[float]] = {r.rank: [] for r in ranks}
        for t in data.grid:
            steps = {r.rank: s for r in ranks if (s := r.step.get(t))}
            waits = {r.rank: w for r in ranks if (w := r.wait.get(t)) is not None}
            if len(steps) >= 2:
                m = _reference(steps.values())
                for rk, s in steps.items():
                    if s >= ratio * m and s - m >= MIN_LAG_S:
                        lag[rk].append(t)
                if max(steps.values()) < ratio * m and len(waits) >= 2:
                    # synchronous DDP: equal step times; the rank the others wait for waits for its data
                    for rk in _waiting_for_input(waits, config):
                        lag[rk].append(t)
        by_rank = {r.rank: r for r in ranks}
        lagging_hosts: dict[str, list[tuple[RankData, float, float]]] = {}
        for rk, times in lag.items():
            for a, b in j.intervals(times):
                lagging_hosts.setdefault(by_rank[rk].host, []).append((by_rank[rk], a, b))
        for host, lags in lagging_hosts.items():
            for items in _together(lags, data.step):  # a node lags while all its ranks do, never across a silence
                _stragglers_of(j, job, ranks, host, items, ratio, out)
    return out


def _together(lags: list, step: float) -> list[list]:
    """(rank, first, last) spans as the runs that overlap in time (gaps of up to two steps bridged, as
    ``spans`` bridges them): a node lags over one run, not from its first lag to its last."""
    runs: list[list] = []  # [spans, last]
    for lag in sorted(lags, key=lambda x: x[1]):
        if runs and lag[1] - runs[-1][1] <= 2.5 * step:
            runs[-1][0].append(lag)
            runs[-1][1] = max(runs[-1][1], lag[2])
        else:
            runs.append([[lag], lag[2]])
    return [items for items, _ in runs]


def _stragglers_of(j: Judging, job: str, ranks: list[RankData], host: str, items: list, ratio: float,
                   out: list) -> None:
    """The findings of one run of lags on one host: the node's, where all its ranks lag, else each rank's."""
    host_ranks = [r for r in ranks if r.host == host]
    others = [r for r in ranks if r.host != host]
    n_hosts = len({r.host for r in ranks})
    lagging = {r.rank for r, _, _ in items}
    if len(host_ranks) > 1 and lagging == {r.rank for r in host_ranks} and n_hosts > 1:
        a, b = min(x[1] for x in items), max(x[2] for x in items)
        own = _mean(v for r in host_ranks for v in _between(r.step, a, b))
        med = _median_step(j, others, a, b)
        head = (f"all {len(host_ranks)} ranks on {host} lag: {_fmt(own)} a step vs {_fmt(med)} on the other "
                f"{len(others)} ranks of job {job}")
        waiters = ""
        if _in_step(own, med, ratio):
            head = (f"all {len(host_ranks)} ranks on {host} hold job {job} back: every rank steps at their "
                    f"pace ({_fmt(own)} a step) and {_others_wait(len(others))} for them in collectives")
            waiters = _waiters(j, others, a, b)
        out.append(found(STRAGGLER_NODE, host, f"job {job}", a, b,
                         head + _why(j, host, host_ranks, a, b, others) + waiters, job, tuple(sorted(lagging))))
        return
    for r, a, b in items:
        own = _mean(_between(r.step, a, b))
        rest = [x for x in ranks if x.rank != r.rank]
        med = _median_step(j, rest, a, b)
        waiters = ""
        if _in_step(own, med, ratio):  # synchronous: the lag shows in what the ranks wait for, not the step time
            head = (f"rank {r.rank} of job {job} on {host} holds the job back: every rank steps at its pace "
                    f"({_fmt(own)} a step) and {_others_wait(len(rest))} for it in collectives")
            waiters = _waiters(j, rest, a, b)
        else:
            head = (f"rank {r.rank} of job {job} on {host}: {_fmt(own)} a step vs a median of "
                    f"{_fmt(med)} over the other {len(rest)} ranks")
        out.append(found(STRAGGLER, host, f"job {job} rank {r.rank}", a, b,
                         head + _why(j, host, [r], a, b, rest) + waiters, job, (r.rank,)))


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


def _in_step(own: float | None, med: float | None, ratio: float) -> bool:
    return own is not None and med is not None and own < ratio * med


def _waiters(j: Judging, rest: list[RankData], a: float, b: float) -> str:
    """What the waiting ranks' GPUs do meanwhile: busy by utilization at little power is a collective's
    spin, not work (rules/collective.py)."""
    data = j.data
    if len(rest) > EXACT_UP_TO:  # a large job: the job's figure for the interval, computed once
        job = rest[0].job
        states = j.job_figure(job, a, b, "waiters",
                              lambda: _gpu_states(data, [r for r in data.ranks.values() if r.job == job], a, b))
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


def _waiting_for_input(waits: dict, c: Thresholds) -> list:
    """Ranks whose input wait is high and ``cluster_straggler_wait_gap`` above (and ``cluster_straggler_wait_ratio``
    times) the others' median. The median of the others is the median of all but one value: computed
    from the sorted list in O(1) per rank, not by rebuilding it (10 000 ranks × 720 instants)."""
    vals = sorted(waits.values())
    n = len(vals)
    out = []
    for rk, w in waits.items():
        if w < c.cluster_straggler_input_wait:
            continue
        # the median of vals without one copy of w
        i = vals.index(w) if n < 64 else _bisect_index(vals, w)
        rest_mid = _median_without(vals, i)
        if w - rest_mid >= c.cluster_straggler_wait_gap and w >= c.cluster_straggler_wait_ratio * rest_mid:
            out.append(rk)
    return out


def _bisect_index(vals, w):
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


def _median_step(j: Judging, ranks: list[RankData], a: float, b: float) -> float | None:
    vals = _per_rank_means(j, ranks, a, b, "step")
    return statistics.median(vals) if vals else None


def _per_rank_means(j: Judging, ranks: list[RankData], a: float, b: float, attr: str) -> list[float]:
    """Each rank's mean of ``attr`` over [a, b]. For a large job the same interval is asked about
    for many lagging ranks: the means of every rank of the job are computed once per interval,
    and "the others" are all of them (one rank more or less does not move a median of hundreds)."""
    if len(ranks) <= EXACT_UP_TO:
        vals = [_mean(_between(getattr(r, attr), a, b)) for r in ranks]
        return [v for v in vals if v is not None]
    job = ranks[0].job

    def every_rank() -> list[float]:
        vals = [_mean(_between(getattr(r, attr), a, b)) for r in j.data.ranks.values() if r.job == job]
        return [v for v in vals if v is not None]

    return j.job_figure(job, a, b, attr, every_rank)


def _fmt(v):
    return "–" if v is None else f"{v:.3g} s"


def stalled(data: ClusterData, config: Thresholds = DEFAULT) -> list[CrossFinding]:
    j = Judging(data, config)
    out = []
    window = max(config.cluster_stall_min_s, min(60.0, 10 * data.step))
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
        for a, b in j.intervals(times):
            hosts = sorted({r.host for r in ranks})
            util = _mean(v for (h, _), g in data.gpus.items() if h in hosts for v in _between(g.util, a, b))
            out.append(found(STALLED, ",".join(hosts[:3]) + ("…" if len(hosts) > 3 else ""), f"job {job}",
                                    a - window, b,
                                    f"no rank of job {job} took a step for {b - a + window:.0f} s "
                                    f"({len(ranks)} ranks on {len(hosts)} node(s)); their GPUs meanwhile: "
                                    f"utilization {_pct(util)}"
                                    + (" (a hung collective keeps GPUs busy)" if util is not None and util > 0.8 else ""),
                                    job))
    return out


def node_starving(data: ClusterData, config: Thresholds = DEFAULT) -> list[CrossFinding]:
    j = Judging(data, config)
    least, factor = config.cluster_node_starving_input_wait, config.cluster_node_starving_ratio
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
                if w >= least and w >= factor * _median_without(vals, _bisect_index(vals, w)):
                    hit[h].append(t)
        for h, times in hit.items():
            for a, b in j.intervals(times):
                mine = [r for r in ranks if r.host == h]
                others = [r for r in ranks if r.host != h]
                w = _mean(v for r in mine for v in _between(r.wait, a, b))
                ow = _mean(v for r in others for v in _between(r.wait, a, b))
                cpu = _mean(_between(data.loader_cpu.get(h, {}), a, b))
                out.append(found(NODE_STARVING, h, f"job {job}", a, b,
                                        f"the {len(mine)} rank(s) on {h} wait for input {_pct(w)} of the time, the "
                                        f"other {len(hosts) - 1} node(s) {_pct(ow)}"
                                        + (f"; {h}'s loader workers at {cpu * 100:.0f} % CPU" if cpu is not None else ""),
                                        job))
    return out


def slow_nodes(data: ClusterData, config: Thresholds = DEFAULT) -> list[CrossFinding]:
    j = Judging(data, config)
    low, normal = config.cluster_slow_node_clock_frac, config.cluster_slow_node_others_clock_frac
    busy = config.cluster_slow_node_min_util / 100  # the grid's utilization is a ratio
    hosts = sorted({h for h, _ in data.gpus})
    if len(hosts) < 2:
        return []
    hit: dict[str, list[float]] = {h: [] for h in hosts}
    by_host = {h: [g for (gh, _), g in data.gpus.items() if gh == h] for h in hosts}
    for t in data.grid:
        per = {}
        for h in hosts:
            ratios = [g.clock_ratio.get(t) for g in by_host[h]
                      if (g.util.get(t) or 0) >= busy and g.clock_ratio.get(t) is not None]
            if ratios:
                per[h] = max(ratios)  # every busy GPU below the line: the highest of them is
        if len(per) < 2:
            continue
        vals = sorted(per.values())
        for h, top in per.items():
            if top < low and _median_without(vals, _bisect_index(vals, top)) >= normal:
                hit[h].append(t)
    out = []
    for h, times in hit.items():
        for a, b in j.intervals(times):
            gpus = [g for (gh, _), g in sorted(data.gpus.items()) if gh == h]
            clk = _mean(v for g in gpus for v in _between(g.clock_ratio, a, b))
            temp = max((v for g in gpus for v in _between(g.temp, a, b)), default=None)
            reasons = sorted({n for g in gpus for v in _between(g.reasons, a, b) for n in reason_names(int(v))}
                             - {"idle"})
            out.append(found(SLOW_NODE, h, h, a, b,
                                    f"all {len(gpus)} GPUs of {h} run at {_pct(clk)} of their maximum SM clock while "
                                    f"the other nodes' stay at full clock"
                                    + (f"; peak {temp:.0f} °C" if temp is not None else "")
                                    + (f"; clock-event reasons: {', '.join(reasons)}" if reasons else "")))
    return out


def gpu_errors(data: ClusterData, config: Thresholds = DEFAULT) -> list[CrossFinding]:
    out = []
    for h in sorted({h for h, _ in data.gpus}):
        bad = []
        times: list[float] = []  # of every GPU's events
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
                times += [t for t, _ in events]
        if bad:
            out.append(found(NODE_GPU_ERRORS, h, h, min(times), max(times), f"{h}: " + "; ".join(bad)))
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


def silent_since(data: ClusterData, config: Thresholds = DEFAULT) -> dict[str, float]:
    """Hosts whose series stopped, each with the time of its last sample (its own sample time where
    Prometheus gave those: the grid carries a sample on for a while). Stopped while others go on
    (as `missing_nodes` judges), or, where every host stopped, long before the window's end."""
    seen = last_seen(data)
    if not seen:
        return {}
    newest = max(seen.values())
    gap = _missing_after(data, config)
    return {h: min(t, data.samples.last(h, t)) for h, t in seen.items()
            if newest - t > gap or data.end - t > max(6 * data.step, 60.0)}


def silence(data: ClusterData, since: float) -> float:
    """How long a host has been silent at the end of the read: the one age the host's line, its
    finding's span and its evidence all say (to a tenth of a second, as the span is shown)."""
    return round(data.end - since, 1)


def silent_hosts(data: ClusterData, config: Thresholds = DEFAULT) -> dict[str, float]:
    """Hosts whose series stopped: seconds since each one's last sample (``silence``)."""
    return {h: silence(data, t) for h, t in silent_since(data, config).items()}


def _missing_after(data: ClusterData, c: Thresholds) -> float:
    return max(3 * data.step, c.cluster_node_missing_s)


def missing_nodes(data: ClusterData, config: Thresholds = DEFAULT) -> list[CrossFinding]:
    """A node whose series stopped while the others' went on: still silent at the end of the range,
    or silent for a while within it (from its real sample times: Prometheus's grid carries a value
    over a gap). A silence of every node at once is Prometheus's gap, not theirs (a note)."""
    last_seen_ = last_seen(data)
    if len(last_seen_) < 2:
        return []
    newest = max(last_seen_.values())
    gap = _missing_after(data, config)
    out = []
    for h, t in sorted(last_seen_.items()):
        jobs = sorted({r.job for r in data.ranks.values() if r.host == h})
        ran = f"; it ran ranks of job {', '.join(jobs)}" if jobs else ""
        for a, b, silent in data.samples.silences(h):
            if silent > max(gap, data.samples.tolerance) and b >= data.start and a <= data.end:
                out.append(found(NODE_MISSING, h, h, max(a, data.start), b,
                                 f"{h}'s series stopped while the other nodes' went on ({silent:.0f} s without it), "
                                 f"then came back" + ran))
        if newest - t > gap:
            t = min(t, data.samples.last(h, t))  # the grid carried its last sample on for a while
            # up to the end of the read, as the host's own line counts it: one age on the screen
            out.append(found(NODE_MISSING, h, h, t, data.end,
                             f"{h}'s series stopped at its last sample while the other nodes' go on "
                             f"({fmt_duration(silence(data, t))} without it)" + ran))
    return out


def claimed_twice(data: ClusterData, config: Thresholds = DEFAULT) -> list[CrossFinding]:
    """Two sources for one host, one rank claimed twice, a job's ranks owned by different users (claims.py)."""
    return [found(_BY_ID[c.rule], c.host, c.subject, c.start, c.end, c.evidence, c.job)
            for c in data.conflicts]


ALL = (stragglers, stalled, node_starving, slow_nodes, gpu_errors, missing_nodes, claimed_twice)
WITHOUT_RANKS = (slow_nodes, gpu_errors, missing_nodes, claimed_twice)  # what dcgm-exporter's series alone carry


def evaluate(data: ClusterData, config: Thresholds = DEFAULT, judges=ALL) -> list[CrossFinding]:
    out = []
    for judge in judges:
        out.extend(judge(data, config))
    return _fold_deferring(out)


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _fold_deferring(found: list[CrossFinding]) -> list[CrossFinding]:
    """A finding whose rule defers to another found on the same host and job, at the same time, is
    folded into that one (``defers_to``): "one node's loader starves the job" into the straggler it
    makes, which names the rank and carries the cause. It stays for a node whose ranks starve without
    one standing out as the job's straggler."""
    def folded(f: CrossFinding) -> bool:
        return any(s.rule.id in f.rule.defers_to and s.host == f.host and s.job == f.job
                   and (overlap(s.start, s.end, f.start, f.end) > 0 or s.start <= f.start <= s.end)
                   for s in found)
    return [f for f in found if not f.rule.defers_to or not folded(f)]
