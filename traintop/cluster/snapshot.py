"""What the cluster dashboard shows, read from Prometheus: no Textual here.

A snapshot is the last few minutes of every host, GPU and rank (``query_range`` at a
step that gives the sparklines ~60 points, kept between refreshes: each reads only what
is new), the agents' active findings and the cross-host findings — frozen data the
widgets only draw.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from traintop.reports.analyze import ended
from traintop.cluster.judge import silent_hosts
from traintop.cluster.fetch import ClusterData
from traintop.cluster.report import job_ledgers
from traintop.cluster.groups import Held, held_of
from traintop.cluster.report import findings_of
from traintop.findings import Finding
from traintop.rules.config import DEFAULT, Thresholds

WINDOW_S = 300.0
POINTS = 60


@dataclass(frozen=True)
class GpuLine:
    host: str
    index: int
    model: str
    util: float | None
    power: float | None
    power_limit: float | None
    mem_used: float | None
    mem_total: float | None
    temp: float | None
    clock_ratio: float | None
    spark: tuple[float, ...]  # utilization 0..1, oldest first


@dataclass(frozen=True)
class RankLine:
    job: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    step: float | None
    wait: float | None
    spark: tuple[float, ...]  # step time, oldest first


@dataclass(frozen=True)
class HostLine:
    """A host in one line, for clusters whose GPUs do not fit on a screen: its GPUs' mean
    and lowest utilization, total power, hottest GPU, lowest clock."""
    host: str
    gpus: int
    util: float | None  # mean of its GPUs' latest
    util_min: float | None
    power: float | None  # sum
    temp: float | None  # hottest
    clock_ratio: float | None  # lowest
    spark: tuple[float, ...]  # mean utilization of its GPUs at each instant


@dataclass(frozen=True)
class ClusterSnapshot:
    source: str
    t: float
    hosts: tuple[str, ...]
    gpus: tuple[GpuLine, ...]
    ranks: tuple[RankLine, ...]
    findings: tuple[Finding, ...]  # active at the end of the window, each with its host and scope
    kind: str = "prometheus"
    notes: tuple[str, ...] = ()
    refresh_s: float = 0.0
    jobs: tuple[str, ...] = field(default=())
    host_lines: tuple[HostLine, ...] = ()
    # hosts whose series stopped, with the seconds since their last sample: their last numbers
    # are drawn dimmed with "no data for N s", never as current
    silent: tuple[tuple[str, float], ...] = ()
    unreadable: tuple[str, ...] = ()  # hosts whose agent cannot read their GPUs (no GPU lines: not CPU nodes)
    held: tuple[Held, ...] = ()  # whose processes hold each GPU (the agents' owner series), for grouping by job or user
    window_s: float = WINDOW_S  # the span of the data shown
    goodput: tuple[tuple[str, float], ...] = ()  # (job, share of its ranks' time in training steps), the probes' ledgers

    def silent_for(self, host: str) -> float | None:
        return dict(self.silent).get(host)


def _latest(d: dict):
    return d[max(d)] if d else None


def _spark(d: dict, grid: list) -> tuple[float, ...]:
    return tuple(d.get(t, float("nan")) for t in grid)


def _host_lines(hosts: list[str], gpus: tuple[GpuLine, ...]) -> tuple[HostLine, ...]:
    by_host: dict[str, list[GpuLine]] = {h: [] for h in hosts}
    for g in gpus:
        by_host.setdefault(g.host, []).append(g)
    out = []
    for h, gs in by_host.items():
        utils = [g.util for g in gs if g.util is not None]
        powers = [g.power for g in gs if g.power is not None]
        temps = [g.temp for g in gs if g.temp is not None]
        clocks = [g.clock_ratio for g in gs if g.clock_ratio is not None]
        spark = []
        for col in zip(*(g.spark for g in gs)):
            vals = [v for v in col if v == v]  # NaN: no sample at that instant
            spark.append(sum(vals) / len(vals) if vals else float("nan"))
        out.append(HostLine(h, len(gs), sum(utils) / len(utils) if utils else None, min(utils, default=None),
                            sum(powers) if powers else None, max(temps, default=None), min(clocks, default=None),
                            tuple(spark)))
    return tuple(out)


def snapshot_from(data: ClusterData, findings: list[Finding], refresh_s: float = 0.0,
                  config: Thresholds = DEFAULT) -> ClusterSnapshot:
    gpus = tuple(GpuLine(h, i, g.model, _latest(g.util), _latest(g.power), g.power_limit, _latest(g.mem_used),
                         g.mem_total, _latest(g.temp), _latest(g.clock_ratio), _spark(g.util, data.grid))
                 for (h, i), g in sorted(data.gpus.items()))
    ranks = tuple(RankLine(r.job, r.rank, r.local_rank, r.world_size, r.host, _latest(r.step), _latest(r.wait),
                           _spark(r.step, data.grid))
                  for _, r in sorted(data.ranks.items()))
    # still active: the finding reaches the last step of the window
    active = tuple(f for f in findings if ended(f) >= data.end - 2 * data.step)
    hosts = data.hosts
    return ClusterSnapshot(data.url, data.end, tuple(hosts), gpus, ranks, active, data.mode,
                           tuple(data.notes), refresh_s, tuple(sorted({r.job for r in data.ranks.values()})),
                           _host_lines(hosts, gpus), tuple(sorted(silent_hosts(data, config).items())),
                           tuple(sorted(data.unreadable)), held_of(data, config),
                           data.grid[-1] - data.grid[0] if len(data.grid) > 1 else WINDOW_S,
                           tuple((j, row["goodput"]) for row in job_ledgers(data) for j in (row["job"],)))


class PrometheusSource:
    """Reads a snapshot of the last ``window`` seconds; called from a worker thread. The
    window is kept between calls: each reads only what is new (rolling.py)."""

    def __init__(self, url: str, job: str | None = None, window: float = WINDOW_S,
                 config: Thresholds = DEFAULT) -> None:
        from traintop.cluster.promapi import Prometheus
        from traintop.cluster.rolling import RollingCluster

        self.prom = Prometheus(url, timeout=10.0)
        self.job = job
        self.window = window
        self.config = config
        self.step = float(max(1, round(window / POINTS)))  # whole seconds: every read's instants line up
        self.rolling = RollingCluster(self.prom, job, window, self.step)
        self._lock = threading.Lock()  # the kept window is read and rolled by one caller at a time

    def __call__(self) -> ClusterSnapshot:
        with self._lock:
            return self._read()

    def _read(self) -> ClusterSnapshot:
        from traintop.cluster.budget import REFRESH_BYTES, REFRESH_POINTS, REFRESH_SERIES
        from traintop.cluster.dcgm import dcgm_findings, has_dcgm
        from traintop.cluster.promapi import no_gc
        from traintop.errors import NoTraintopSeries

        t0 = time.perf_counter()
        end = time.time()
        with self.prom.read_budget(REFRESH_BYTES, REFRESH_SERIES, "one refresh", REFRESH_POINTS):
            try:
                data = self.rolling.read(end)
                with no_gc():
                    findings = findings_of(data, self.config)[0]  # less the agents' verdicts a cross-host finding explains
            except NoTraintopSeries as e:
                start = end - self.window
                if self.job or not has_dcgm(self.prom, start, end):
                    raise NoTraintopSeries(e.shown_url, longer="--window") from None  # the cluster view's
                data, findings, _ = dcgm_findings(self.prom, start, end, self.step, self.config)
        return snapshot_from(data, findings, time.perf_counter() - t0, self.config)

    def close(self) -> None:
        self.prom.close()
