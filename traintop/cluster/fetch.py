"""Reads a time range of a cluster out of Prometheus: GPUs by host, ranks by job, agents' findings.

Everything lands on one time grid (``start + k·step``, the grid ``query_range`` answers
on), so the cross-host rules compare hosts and ranks at the same instants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traintop.cluster import series as S
from traintop.cluster.promapi import Prometheus, Series
from traintop.errors import TraintopError

MAX_POINTS = 720  # per series and query: 2 h at a 10 s step


def host_of(s: Series) -> str:
    return s.get("Hostname", "hostname", "instance", default="?")


def job_of(s: Series) -> str:
    # Without honor_labels, Prometheus renames the exposed `job` to `exported_job`.
    return s.get("exported_job", "job", default="unknown")


@dataclass
class GpuData:
    host: str
    index: int
    model: str = ""
    util: dict = field(default_factory=dict)  # t -> ratio 0..1
    clock_ratio: dict = field(default_factory=dict)  # t -> SM clock / max
    power: dict = field(default_factory=dict)
    power_limit: float | None = None
    mem_used: dict = field(default_factory=dict)
    mem_total: float | None = None
    temp: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    xid_total: dict = field(default_factory=dict)
    last_xid: dict = field(default_factory=dict)
    ecc_uncorrected: dict = field(default_factory=dict)


@dataclass
class RankData:
    job: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    step: dict = field(default_factory=dict)  # t -> seconds per step
    steps: dict = field(default_factory=dict)  # t -> steps so far
    wait: dict = field(default_factory=dict)  # t -> input wait ratio


@dataclass
class AgentFinding:
    host: str
    rule: str
    severity: str
    subject: str
    times: list  # grid times at which it was active


@dataclass
class ClusterData:
    url: str
    start: float
    end: float
    step: float
    grid: list
    gpus: dict = field(default_factory=dict)  # (host, index) -> GpuData
    ranks: dict = field(default_factory=dict)  # (job, rank) -> RankData
    findings: list = field(default_factory=list)
    loader_cpu: dict = field(default_factory=dict)  # host -> {t: ratio}
    mode: str = "traintop"
    notes: list = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return sorted({h for h, _ in self.gpus} | {r.host for r in self.ranks.values()})

    def jobs(self) -> dict[str, list[RankData]]:
        out: dict[str, list[RankData]] = {}
        for r in self.ranks.values():
            out.setdefault(r.job, []).append(r)
        for rs in out.values():
            rs.sort(key=lambda r: r.rank)
        return out


def choose_step(span: float, scrape_s: float = 1.0) -> float:
    return max(scrape_s, span / MAX_POINTS)


def _snap(t: float, start: float, step: float) -> float:
    return round(start + round((t - start) / step) * step, 3)


def _points(s: Series, start: float, step: float, scale: float = 1.0) -> dict:
    return {_snap(t, start, step): v * scale for t, v in s.points}


def _int(text: str, default: int = 0) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def fetch(prom: Prometheus, start: float, end: float, step: float | None = None, job: str | None = None) -> ClusterData:
    step = step or choose_step(end - start)
    n = int((end - start) / step) + 1
    data = ClusterData(prom.shown, start, end, step, [round(start + k * step, 3) for k in range(n)])

    def rng(name: str) -> list[Series]:
        return prom.query_range(S.P + name, start, end, step)

    util = rng("gpu_utilization_ratio")
    if not util and not prom.query_range(f"count({S.P}agent_info)", start, end, step):
        raise TraintopError(f"no traintop series at {prom.shown} between the times asked "
                            "(is `traintop agent` scraped? try a longer --since)")
    for name, ranks_field in (("step_seconds", "step"), ("steps_total", "steps"), ("input_wait_ratio", "wait")):
        for s in rng(name):
            j = job_of(s)
            if job is not None and j != job:
                continue
            key = (j, _int(s.get("rank")))
            r = data.ranks.get(key)
            if r is None:
                r = data.ranks[key] = RankData(j, key[1], _int(s.get("local_rank")), _int(s.get("world_size"), 1),
                                               host_of(s))
            getattr(r, ranks_field).update(_points(s, start, step))
    if job is not None and not data.ranks:
        raise TraintopError(f"no ranks of job {job!r} at {prom.shown} between the times asked")
    hosts = {r.host for r in data.ranks.values()} if job is not None else None

    def gpu(s: Series) -> GpuData | None:
        h = host_of(s)
        if hosts is not None and h not in hosts:
            return None
        key = (h, _int(s.get("gpu")))
        g = data.gpus.get(key)
        if g is None:
            g = data.gpus[key] = GpuData(h, key[1], s.get("modelName", "model_name"))
        return g

    for s in util:
        if (g := gpu(s)) is not None:
            g.util.update(_points(s, start, step))
    clock_max = {(host_of(s), _int(s.get("gpu"))): s.last for s in rng("gpu_sm_clock_max_hertz")}
    for s in rng("gpu_sm_clock_hertz"):
        mx = clock_max.get((host_of(s), _int(s.get("gpu"))))
        if mx and (g := gpu(s)) is not None:
            g.clock_ratio.update(_points(s, start, step, 1 / mx))
    for name, attr in (("gpu_power_watts", "power"), ("gpu_memory_used_bytes", "mem_used"),
                       ("gpu_temperature_celsius", "temp"), ("gpu_clock_event_reasons", "reasons"),
                       ("gpu_xid_errors_total", "xid_total"), ("gpu_last_xid", "last_xid"),
                       ("gpu_ecc_uncorrected_errors_total", "ecc_uncorrected")):
        for s in rng(name):
            if (g := gpu(s)) is not None:
                getattr(g, attr).update(_points(s, start, step))
    for name, attr in (("gpu_power_limit_watts", "power_limit"), ("gpu_memory_total_bytes", "mem_total")):
        for s in prom.query(f"max_over_time({S.P}{name}[{max(1, int(end - start))}s])", at=end):
            if (g := gpu(s)) is not None:
                setattr(g, attr, s.last)
    for s in rng(S.FINDING_ACTIVE):
        h = host_of(s)
        if hosts is not None and h not in hosts:
            continue
        times = sorted(_points(s, start, step))
        if times:
            data.findings.append(AgentFinding(h, s.get("rule"), s.get("severity"), s.get("subject"), times))
    for s in rng(S.HOST_LOADER_CPU):
        data.loader_cpu.setdefault(host_of(s), {}).update(_points(s, start, step))
    return data
