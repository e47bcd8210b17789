"""Where Prometheus holds no samples: the instants its grid fills from an older one.

A range query answers at each instant with the newest sample of the last 5 minutes (its
lookback). Where no scrape happened (Prometheus itself down: it writes no staleness marker
then) or a node's samples stop without one (backfilled data), the grid repeats the last
value: a step counter that reads as flat, a stall that never was. ``timestamp()`` gives each
host's real sample times: an instant without a recent sample holds no value, and a silence is
either Prometheus's own (no host has a sample: a gap in the data, a note) or one node's while
the others report (that node stopped reporting, even if it came back since).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from traintop.units import fmt_duration

SLACK = 3.0  # sample intervals: a sample older than this at an instant is not the instant's


@dataclass
class Samples:
    """Each host's sample times in the range, and how old a sample may be and still be current."""

    times: dict = field(default_factory=dict)  # host -> sorted sample times
    at: dict = field(default_factory=dict)  # host -> {grid t: time of the sample Prometheus answers with}
    tolerance: float = 0.0  # 0: unknown (too few samples): nothing is judged from them

    def current(self, host: str, t: float) -> bool:
        """Whether ``host`` has a sample at most ``tolerance`` old at instant ``t`` (an unknown host: yes)."""
        at = self.at.get(host)
        if at is None or not self.tolerance:
            return True
        ts = at.get(t)
        return ts is not None and t - ts <= self.tolerance

    def last(self, host: str, default: float) -> float:
        """``host``'s newest sample time (``default`` where unknown)."""
        mine = self.times.get(host)
        return mine[-1] if mine and self.tolerance else default

    def outages(self) -> list[tuple[float, float]]:
        """Spans where no host has a sample: (the last sample before, the first after)."""
        if not self.tolerance:
            return []
        every = sorted({t for ts in self.times.values() for t in ts})
        return [(a, b) for a, b in zip(every, every[1:]) if b - a > self.tolerance]

    def silences(self, host: str) -> list[tuple[float, float, float]]:
        """``host``'s own silences that it came back from: (last sample, next sample, seconds of it
        while some other host reported)."""
        if not self.tolerance:
            return []
        mine = self.times.get(host, [])
        outages = self.outages()
        out = []
        for a, b in zip(mine, mine[1:]):
            if b - a > self.tolerance:
                lost = sum(max(0.0, min(b, g1) - max(a, g0)) for g0, g1 in outages)
                out.append((a, b, b - a - lost))
        return out


def read(series: dict) -> Samples:
    """``series``: host -> [{grid t: sample time}] (the grid of ``max by (host) (timestamp(…))``)."""
    s = Samples()
    diffs = []
    for host, grids in series.items():
        at: dict = {}
        for g in grids:
            for t, ts in g.items():
                at[t] = max(ts, at.get(t, ts))
        s.at[host] = at
        s.times[host] = sorted(set(at.values()))
        diffs += [b - a for a, b in zip(s.times[host], s.times[host][1:])]
    if len(diffs) >= 2:
        s.tolerance = SLACK * statistics.median(diffs)
    return s


def note(a: float, b: float, t0: float) -> str:
    """The report's note on an outage of Prometheus's data from ``a`` to ``b`` (times told from ``t0``)."""
    def clock(t):
        return time.strftime("%H:%M:%S", time.gmtime(t))
    return (f"Prometheus has no data from any host between {fmt_duration(a - t0)} and {fmt_duration(b - t0)} "
            f"({clock(a)} to {clock(b)} UTC, {fmt_duration(b - a)}): a gap in its data (no scrape happened), "
            "not a stall or a lost node; nothing over it is judged or counted as lost")
