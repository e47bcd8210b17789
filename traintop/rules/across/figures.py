"""Figures the cross-host rules read off the grid: means over an interval, a job's pace, the
median of the others, and the evidence sentences's parts (why a rank lags, what the others do)."""

from __future__ import annotations

import bisect
import statistics
from traintop.rules.across.grid import Across, RankData
from traintop.rules.config import Thresholds
from traintop.samples import reason_names

EXACT_UP_TO = 32  # ranks; beyond, a job-wide figure (computed once per interval) stands for "the others"


def mean(vals) -> float | None:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def between(d: dict, a: float, b: float) -> list[float]:
    return [v for t, v in d.items() if a <= t <= b]


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f} %"


def secs(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g} s"


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def reference(values) -> float:
    """The pace of the job's unhindered ranks: the median of the fastest third, so that slow
    nodes holding many of the ranks do not drag the yardstick towards themselves."""
    vals = sorted(values)
    return statistics.median(vals[: max(1, len(vals) // 3)])


def median_without(vals: list, w: float) -> float:
    """The median of the sorted ``vals`` without one copy of ``w`` (in O(1), not by rebuilding it:
    10 000 ranks × 720 instants)."""
    i = vals.index(w) if len(vals) < 64 else bisect.bisect_left(vals, w)
    n = len(vals) - 1

    def at(k):  # the k-th value of vals with index i removed
        return vals[k] if k < i else vals[k + 1]
    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def waiting_for_input(waits: dict, c: Thresholds) -> list:
    """Ranks whose input wait is high and ``cluster_straggler_wait_gap`` above (and
    ``cluster_straggler_wait_ratio`` times) the others' median."""
    vals = sorted(waits.values())
    out = []
    for rk, w in waits.items():
        if w < c.cluster_straggler_input_wait:
            continue
        rest_mid = median_without(vals, w)
        if w - rest_mid >= c.cluster_straggler_wait_gap and w >= c.cluster_straggler_wait_ratio * rest_mid:
            out.append(rk)
    return out


def per_rank_means(x: Across, ranks: list[RankData], a: float, b: float, attr: str) -> list[float]:
    """Each rank's mean of ``attr`` over [a, b]. For a large job the same interval is asked about
    for many lagging ranks: the means of every rank of the job are computed once per interval,
    and "the others" are all of them (one rank more or less does not move a median of hundreds)."""
    if len(ranks) <= EXACT_UP_TO:
        vals = [mean(between(getattr(r, attr), a, b)) for r in ranks]
        return [v for v in vals if v is not None]
    job = ranks[0].job

    def every_rank() -> list[float]:
        vals = [mean(between(getattr(r, attr), a, b)) for r in x.jobs.get(job, ())]
        return [v for v in vals if v is not None]

    return x.figure((job, a, b, attr), every_rank)


def median_step(x: Across, ranks: list[RankData], a: float, b: float) -> float | None:
    vals = per_rank_means(x, ranks, a, b, "step")
    return statistics.median(vals) if vals else None


def why(x: Across, host: str, ranks: list[RankData], a: float, b: float, others: list[RankData]) -> str:
    """Why a rank or node lags, from its host's own series."""
    data, c = x.data, x.config
    parts = []
    wait = mean(v for r in ranks for v in between(r.wait, a, b))
    other_wait = per_rank_means(x, others, a, b, "wait")
    high = wait is not None and wait >= c.cluster_straggler_input_wait
    if high:
        parts.append(f"input wait {pct(wait)}"
                     + (f" (the other ranks' median {pct(statistics.median(other_wait))})" if other_wait else ""))
    cpu = mean(between(data.loader_cpu.get(host, {}), a, b))
    if cpu is not None and high:
        parts.append(f"loader workers at {cpu * 100:.0f} % CPU")
    for r in ranks:
        g = data.gpus.get((host, r.local_rank))
        if g is None:
            continue
        clk = mean(between(g.clock_ratio, a, b))
        if clk is not None and clk < c.cluster_slow_node_clock_frac:
            reasons = sorted({n for v in between(g.reasons, a, b) for n in reason_names(int(v))} - {"idle"})
            parts.append(f"GPU {g.index} clocked at {pct(clk)} of max" + (f" ({', '.join(reasons)})" if reasons else ""))
    titles = sorted({title for title, t0, t1 in x.agent_warnings().get(host, ()) if t0 <= b and t1 >= a})
    if titles:
        parts.append(f"{host}'s agent reports {', '.join(titles)}")
    return "; why, from " + host + ": " + "; ".join(parts) if parts else f"; {host}'s own series show no cause"


def gpu_states(x: Across, ranks: list[RankData], a: float, b: float) -> list:
    states = []
    for r in ranks:
        g = x.data.gpus.get((r.host, r.local_rank))
        if g is None:
            continue
        u, p = mean(between(g.util, a, b)), mean(between(g.power, a, b))
        if u is not None:
            states.append((r, g, u, p))
    return states


def waiters(x: Across, rest: list[RankData], a: float, b: float) -> str:
    """What the waiting ranks' GPUs do meanwhile: busy by utilization at little power is a collective's
    spin, not work (rules/collective.py)."""
    if len(rest) > EXACT_UP_TO:  # a large job: the job's figure for the interval, computed once
        job = rest[0].job
        states = x.figure((job, a, b, "waiters"), lambda: gpu_states(x, x.jobs.get(job, []), a, b))
    else:
        states = gpu_states(x, rest, a, b)
    if not states:
        return ""
    if len(states) <= 3:
        shown = ", ".join(f"{r.host} GPU {g.index} {pct(u)} busy"
                          + (f" at {p:.0f} W" + (f" of {g.power_limit:.0f} W" if g.power_limit else "") if p else "")
                          for r, g, u, p in states)
    else:
        powers = [p for *_, p in states if p is not None]
        shown = (f"their {len(states)} GPUs {pct(statistics.median(u for *_, u, _ in states))} busy (median)"
                 + (f" at {statistics.median(powers):.0f} W" if powers else ""))
    return f"; meanwhile the others' GPUs: {shown}"
