"""What a finding costs: the GPU time it left unused and the energy its GPUs drew, in one place.

A finding wastes GPU time by its rule: the GPU's idle share while it lasts (starvation,
underuse, imbalance, an idle GPU), its SM clock's shortfall from the maximum (thermal),
the GPU's whole time (a stall: nothing trains, and a spinning collective reads 100 %), or
the others' wait (a straggler: every other GPU steps at the slow one's pace, so each waits
for the share of the time the slow one idles; their spinning NCCL kernels read ~100 %, so
their own utilization cannot say it. The slow GPU's own idle time is its own finding's,
starvation's for instance; like imbalance, every other GPU of the source counts).
Other findings (creeping memory, fragmentation, information) cost nothing by themselves;
one that a stronger finding explains costs nothing either: its time is counted there.

Every front end integrates the same way, over the samples present: each sample holds
until the next one, unless the next is further away than a gap, and the last holds what
its kind of series says (``Holds``). ``analyze`` runs it over a recording's samples, the
cluster report over Prometheus's grid, the agent one tick at a time. No I/O, no drawing.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable

from traintop.metrics import gpu_index

WASTE_FROM_UTIL = frozenset({"starvation", "underuse", "imbalance", "idle_gpu", "pause"})
WASTE_FROM_CLOCK = frozenset({"thermal"})
WASTE_ALL = frozenset({"stall", "stalled_job"})  # stalled_job: the cluster's, over every GPU of the job's hosts
WASTE_OF_OTHERS = frozenset({"straggler"})  # a cross-host straggler is costed by the verdicts it explains

# which share of a GPU a rule's finding leaves unused, by the series it is read from
IDLE, CLOCK, WHOLE, OTHERS = "idle", "clock", "whole", "others"

GAP_INTERVALS = 5  # a recording's sample holds at most this many intervals (a suspended machine, a stalled sampler)
LAST_POINT_S = 30.0  # what a Prometheus grid point with no neighbour stands for (a few scrapes)
NAN = float("nan")


def wasted_share(rule: str) -> str | None:
    """What a finding of ``rule`` leaves unused (IDLE, CLOCK, WHOLE or OTHERS), None: nothing by itself."""
    if rule in WASTE_ALL:
        return WHOLE
    if rule in WASTE_OF_OTHERS:
        return OTHERS
    if rule in WASTE_FROM_UTIL:
        return IDLE
    if rule in WASTE_FROM_CLOCK:
        return CLOCK
    return None


def idle_share(util_ratio: float | None) -> float:
    """1 − utilization (0..1) of one sample; NaN when unknown."""
    return NAN if util_ratio is None else min(1.0, max(0.0, 1.0 - util_ratio))


def clock_share(clock_ratio: float | None) -> float:
    """1 − SM clock / max clock (0..1) of one sample; NaN when unknown."""
    return NAN if clock_ratio is None else min(1.0, max(0.0, 1.0 - clock_ratio))


def clock_ratio(sm_clock: float | None, sm_clock_max: float | None) -> float | None:
    return sm_clock / sm_clock_max if sm_clock and sm_clock_max else None


def gpus_of(subject: str, indices: Iterable[int]) -> list[int]:
    """The GPUs a finding is about: one ("gpu3"), all of them ("gpus": imbalance, a waiting rank
    loses its time as surely as a starved one), or none (host, process, a rank)."""
    indices = list(indices)
    i = gpu_index(subject)
    if i is not None:
        return [i] if i in indices else []
    return indices if subject == "gpus" else []


def costs(rule: str, explained_by: str | None) -> str | None:
    """What a finding leaves unused, None when it costs nothing (its rule's, or explained)."""
    return None if explained_by else wasted_share(rule)


def unused_at(share: str, gpu) -> float:
    """The share of one GPU sample (``samples.GpuSample``) left unused; NaN when unknown."""
    if share == WHOLE:
        return 1.0
    if share in (IDLE, OTHERS):  # OTHERS: this GPU's idle share, which each other GPU waits
        return idle_share(None if gpu.util is None else gpu.util / 100)
    return clock_share(clock_ratio(gpu.sm_clock, gpu.sm_clock_max))


def sample_cost(rule: str, subject: str, explained_by: str | None, gpus: dict) -> float | None:
    """GPUs' worth left unused by one finding at one sample (``gpus``: index -> GpuSample); times
    how long the sample holds, that is its GPU-seconds. None: the finding is about no GPU."""
    indices = gpus_of(subject, gpus)
    if not indices:
        return None
    share = costs(rule, explained_by)
    if share is None:
        return 0.0
    unused = sum(x for x in (unused_at(share, gpus[i]) for i in indices) if x == x)
    if share == OTHERS:  # times the other GPUs in use (others_waiting_hours says which)
        unused *= sum(1 for i, g in gpus.items() if i not in indices and (g.util is None or g.util > 0))
    return unused


@dataclass(frozen=True, slots=True)
class Holds:
    """How long a sample stands for: until the next sample when that comes within ``gap_s``;
    ``after_gap_s`` when it is further away; ``last_s`` when there is none."""

    gap_s: float
    after_gap_s: float
    last_s: float

    @classmethod
    def recording(cls, interval: float, times=()) -> "Holds":
        """A session's samples: the last ends the session; across a gap a sample holds
        ``GAP_INTERVALS`` intervals (the sampling interval, or the samples' own median spacing
        where that is longer: an imported log says what it was sampled at only by its times)."""
        gaps = sorted(b - a for a, b in zip(times, times[1:])) if len(times) > 2 else ()
        spacing = gaps[len(gaps) // 2] if gaps else 0.0
        cap = GAP_INTERVALS * max(interval, spacing, 0.01)
        return cls(cap, cap, 0.0)

    @classmethod
    def grid(cls, step: float) -> "Holds":
        """Prometheus's grid: a point stands for its step where the series goes on to the next
        point; one with nothing after it (the end of the data, a range or step far longer than
        the data) stands for a few scrapes, not a whole step."""
        return cls(step * (1 + 1e-9), min(step, LAST_POINT_S), min(step, LAST_POINT_S))

    def held(self, t: float, t_next: float | None) -> float:
        if t_next is None:
            return self.last_s
        dt = t_next - t
        return dt if dt <= self.gap_s else self.after_gap_s


class Series:
    """One sampled series (values NaN where unknown) and its integral over any span, from sums
    built once: a day-long finding costs two bisections."""

    __slots__ = ("t", "v", "holds", "_prefix", "_held")

    def __init__(self, times, values, holds: Holds) -> None:
        self.t, self.v, self.holds = times, values, holds
        self._prefix: list[float] | None = None
        self._held: list[float] | None = None

    @classmethod
    def of_points(cls, points: dict, holds: Holds, share=lambda v: v) -> "Series":
        """A series from {t: value} (a Prometheus grid), each value turned by ``share``."""
        times = sorted(points)
        return cls(array("d", times), array("d", (share(points[t]) for t in times)), holds)

    def _built(self) -> tuple[list[float], list[float]]:
        """How long each sample holds and the prefix sums of value × hold, made on first use."""
        if self._held is None or self._prefix is None:
            t, n = self.t, len(self.t)
            self._held = [self.holds.held(t[i], t[i + 1] if i + 1 < n else None) for i in range(n)]
            steps = [max(0.0, v) * h if v == v else 0.0 for v, h in zip(self.v, self._held)]
            self._prefix = [0.0, *accumulate(steps)]
        return self._held, self._prefix

    def seconds(self, t0: float = -math.inf, t1: float = math.inf) -> float:
        """∫ value dt over [t0, t1] (value-seconds): each sample holding as ``holds`` says."""
        t = self.t
        if not t or t1 < t0:
            return 0.0
        held, prefix = self._built()
        v = self.v

        def part(i: int, a: float, b: float) -> float:  # sample i's share of [a, b]
            x = v[i]
            if x != x:
                return 0.0
            return max(0.0, x) * max(0.0, min(t[i] + held[i], b) - max(t[i], a))

        i0 = bisect.bisect_left(t, t0)
        i1 = bisect.bisect_right(t, t1) - 1
        total = part(i0 - 1, t0, t1) if i0 > 0 else 0.0  # the sample before the span holds into it
        if i1 >= i0:
            total += prefix[i1] - prefix[i0] + part(i1, t0, t1)
        return total

    def hours(self, t0: float = -math.inf, t1: float = math.inf) -> float:
        return self.seconds(t0, t1) / 3600.0

    def at(self, t: float) -> float | None:
        """The value that holds at ``t`` (NaN where unknown); None where no sample holds."""
        held, _ = self._built()
        i = bisect.bisect_right(self.t, t) - 1
        return self.v[i] if i >= 0 and t < self.t[i] + held[i] else None

    def weighted_hours(self, t0: float, t1: float, weight) -> float:
        """Like ``hours``, each sample's part times ``weight(its time)``: one loop over the span."""
        t = self.t
        if not t or t1 < t0:
            return 0.0
        held, _ = self._built()
        v = self.v
        total = 0.0
        for i in range(max(0, bisect.bisect_left(t, t0) - 1), bisect.bisect_right(t, t1)):
            x = v[i]
            if x == x:
                part = max(0.0, min(t[i] + held[i], t1) - max(t[i], t0))
                if part:
                    total += max(0.0, x) * part * weight(t[i])
        return total / 3600.0


def energy_kwh(power: Series, counter: Series, t0: float, t1: float) -> float:
    """What one GPU drew over [t0, t1]: its energy counter's rise (J) between the first and the last
    time it was read inside the span, with power (W) integrated over the edges before and after;
    power integrated over time where the counter was not recorded. The counter is read every 30 s
    (each sample repeats the last reading), so the ends of the span are where a new reading first
    appears, not the span's own ends. Both series share their sample times."""
    t, e = counter.t, counter.v
    i0, i1 = bisect.bisect_left(t, t0), bisect.bisect_right(t, t1) - 1
    j0 = next((j for j in range(i0 + 1, i1 + 1) if e[j] == e[j] and e[j] != e[j - 1]), None)
    j1 = next((j for j in range(i1, i0, -1) if e[j] == e[j] and e[j] != e[j - 1]), None)
    if j0 is not None and j1 is not None and j1 > j0 and e[j1] >= e[j0] and e[j0 - 1] == e[j0 - 1]:
        edges = power.hours(t0, t[j0]) + power.hours(t[j1], t1)
        return (e[j1] - e[j0]) / 3.6e6 + edges / 1000.0
    return power.hours(t0, t1) / 1000.0  # W·h -> kWh


class GpuSeries:
    """One GPU's series for costing findings: the share it left idle and its clock's shortfall
    (NaN where unknown), and where known its power (W) and energy counter (J). ``idle``'s
    samples are the GPU's own: its whole time is theirs."""

    __slots__ = ("idle", "clock", "power", "energy", "_whole")

    def __init__(self, idle: Series, clock: Series, power: Series | None = None, energy: Series | None = None) -> None:
        self.idle, self.clock, self.power, self.energy = idle, clock, power, energy
        self._whole: Series | None = None

    @property
    def whole(self) -> Series:
        if self._whole is None:
            self._whole = Series(self.idle.t, array("d", [1.0]) * len(self.idle.t), self.idle.holds)
        return self._whole

    def lost_hours(self, share: str, t0: float, t1: float) -> float:
        """GPU-hours left unused over [t0, t1] by a finding that leaves ``share`` unused."""
        series = {IDLE: self.idle, OTHERS: self.idle, CLOCK: self.clock, WHOLE: self.whole}[share]
        return series.hours(t0, t1)

    def present_hours(self) -> float:
        """The GPU-hours its samples stand for (the data present, not the range asked)."""
        return self.whole.hours()

    def energy_kwh(self, t0: float, t1: float) -> float:
        if self.power is None:
            return 0.0
        if self.energy is None:
            return self.power.hours(t0, t1) / 1000.0
        return energy_kwh(self.power, self.energy, t0, t1)


def others_waiting_hours(g: "GpuSeries", waiting: list["GpuSeries"], start: float, end: float) -> float:
    """GPU-hours the GPUs in ``waiting`` lose to ``g``'s idle share over [start, end]: at each of
    ``g``'s samples, its idle share times how many of them are in use then. One that reads idle
    waits for nobody (on a shared node it may be another job's, or no job's); an unknown reading
    counts as in use; a busy GPU of another job on the node counts too (GPUs are not told apart
    by job here)."""
    def in_use(t: float) -> int:
        n = 0
        for o in waiting:
            x = o.idle.at(t)
            n += x is not None and not x >= 1.0  # NaN (unknown) counts
        return n
    return g.idle.weighted_hours(start, end, in_use)


def finding_cost(rule: str, subject: str, explained_by: str | None, start: float, end: float,
                 gpus: dict[int, GpuSeries]) -> tuple[float, float]:
    """(GPU-hours lost, kWh drawn) by one finding over [start, end], from its GPUs' series."""
    share = costs(rule, explained_by)
    lost = energy = 0.0
    for i in gpus_of(subject, gpus):
        g = gpus[i]
        if share == OTHERS:  # at each sample, times the other GPUs in use then
            lost += others_waiting_hours(g, [o for k, o in gpus.items() if k != i], start, end)
        elif share is not None:
            lost += g.lost_hours(share, start, end)
        energy += g.energy_kwh(start, end)
    return lost, energy
