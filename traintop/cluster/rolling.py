"""The last few minutes of a cluster, kept between the dashboard's refreshes.

The first read takes the whole window; each refresh after it reads only the instants
since the previous one, plus ``OVERLAP`` before them (a scrape that landed late may have
changed them, or a series gone stale removed them), and drops what left the window. The
grid is whole multiples of the step, so the instants of one read are the instants of the
next. Everything else (the agents' findings, the cross-host rules) sees the same
ClusterData a full read would give.
"""

from __future__ import annotations

import math

from traintop.cluster import claims
from traintop.cluster.fetch import (GPU_ERROR_READS, GPU_READS, RANK_READS, AgentFinding, ClusterData, fetch_grid,
                                    job_ledger)
from traintop.cluster.promapi import Grid, Prometheus

OVERLAP = 2  # instants read again at each refresh

# the time series a read fills (fetch.py): what rolls
_GPU_SERIES = ("util", "clock_ratio") + tuple(attr for _, attr in GPU_READS + GPU_ERROR_READS)
_RANK_SERIES = tuple(attr for _, attr in RANK_READS)


def window_grid(now: float, window: float, step: float) -> Grid:
    """The grid of the last ``window`` seconds ending at the last whole multiple of ``step``."""
    k_end = math.floor(now / step)
    n = max(2, int(round(window / step)) + 1)
    return Grid(float((k_end - n + 1) * step), float(step), n)


class RollingCluster:
    def __init__(self, prom: Prometheus, job: str | None, window: float, step: float) -> None:
        self.prom, self.job, self.window, self.step = prom, job, window, step
        self.data: ClusterData | None = None
        self.full_reads = 0

    def read(self, now: float) -> ClusterData:
        grid = window_grid(now, self.window, self.step)
        old = self.data
        if old is None or old.grid[-1] < grid.start or old.step != grid.step:
            data = fetch_grid(self.prom, grid, now, self.job)
            self.full_reads += 1
        else:
            k_from = max(0, grid.times.index(old.grid[-1]) - OVERLAP + 1) if old.grid[-1] in grid.times else 0
            part_grid = Grid(grid.times[k_from], grid.step, grid.n - k_from)
            part = fetch_grid(self.prom, part_grid, now, self.job, slim=True, part_of=old)
            data = roll(old, part, grid)
        self.data = data
        return data


def _trim(d: dict, start: float, again: list[float]) -> dict:
    """Drop ``d``'s points before ``start`` and at the instants read ``again`` (in place:
    ``d`` is in time order, so only its first few keys are looked at)."""
    while d:
        t = next(iter(d))
        if t >= start:
            break
        del d[t]
    for t in again:
        d.pop(t, None)
    return d


def _roll_into(out: dict, old: dict, new: dict, series, start, again, refresh) -> None:
    """GPUs or ranks: the kept ones trimmed to the window, the new reads laid over them."""
    for key, x in old.items():
        for attr in series:
            _trim(getattr(x, attr), start, again)
        out[key] = x
    for key, n in new.items():
        x = out.get(key)
        if x is None:
            out[key] = n
            continue
        for attr in series:
            getattr(x, attr).update(getattr(n, attr))
        refresh(x, n)


def _refresh_gpu(g, new) -> None:
    g.power_limit = new.power_limit if new.power_limit is not None else g.power_limit
    g.mem_total = new.mem_total if new.mem_total is not None else g.mem_total
    g.model = g.model or new.model


def _refresh_rank(r, new) -> None:
    r.host, r.local_rank, r.world_size, r.uid = new.host, new.local_rank, new.world_size, new.uid
    r.vouched = r.vouched or new.vouched


def _renamed(ranks: dict, owners: claims.JobOwners) -> dict:
    """The kept ranks, each in the job its owner's share of the id is now (a second owner of the
    id may have appeared since: then the first one's ranks are no longer the bare id)."""
    out = {}
    for (_, rank), r in ranks.items():
        r.job = owners.name(r.claimed or r.job, claims.owner_of(r.uid))
        out[(r.job, rank)] = r
    return out


def roll(old: ClusterData, part: ClusterData, grid: Grid) -> ClusterData:
    """``old`` moved to ``grid``: its points before the window dropped, its points from
    ``part``'s first instant on replaced by ``part``'s."""
    start, cut, again = grid.start, part.grid[0], part.grid
    data = ClusterData(part.url, grid.start, part.end, grid.step, grid.times, mode=part.mode)
    _roll_into(data.gpus, old.gpus, part.gpus, _GPU_SERIES, start, again, _refresh_gpu)
    data.job_owners = part.job_owners  # the window's, the refresh's included (fetch_grid's part_of)
    _roll_into(data.ranks, _renamed(old.ranks, data.job_owners), part.ranks, _RANK_SERIES, start, again, _refresh_rank)
    data.gpus = {k: g for k, g in data.gpus.items() if any(getattr(g, a) for a in _GPU_SERIES)}
    data.ranks = {k: r for k, r in data.ranks.items() if any(getattr(r, a) for a in _RANK_SERIES)}
    # a rank two sources claim now is used by no rule (claims.py): its older series, from one of
    # them alone, must not stay behind in the window either (they read as a rank that stopped)
    for c in part.conflicts:
        if c.rule == claims.RANK_CLAIMED and c.job is not None:
            try:
                rank = int(c.subject.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            data.ranks.pop((c.job, rank), None)
    findings: dict[tuple, list] = {}
    for f in old.findings:
        findings.setdefault((f.host, f.rule, f.severity, f.subject), []).extend(t for t in f.times if start <= t < cut)
    for f in part.findings:
        findings.setdefault((f.host, f.rule, f.severity, f.subject), []).extend(f.times)
    data.findings = [AgentFinding(h, rule, sev, subj, times) for (h, rule, sev, subj), times in findings.items() if times]
    for host, d in old.loader_cpu.items():
        data.loader_cpu[host] = _trim(d, start, again)
    for host, d in part.loader_cpu.items():
        data.loader_cpu.setdefault(host, {}).update(d)
    data.loader_cpu = {h: d for h, d in data.loader_cpu.items() if d}
    owners: dict[tuple, dict] = {}  # (host, gpu, who) -> {t: bytes}
    for src, trim in ((old.owners, True), (part.owners, False)):
        for key, held in src.items():
            for who, vals in held:
                d = owners.setdefault((*key, who), {})
                d.update(_trim(dict(vals), start, again) if trim else vals)
    for (host, gpu, who), vals in sorted(owners.items(), key=lambda kv: kv[0][:2]):
        if vals:
            data.owners.setdefault((host, gpu), []).append((who, dict(sorted(vals.items()))))
    # the ledgers' seconds since the view opened: the first read's window, then each refresh's
    for key, buckets in (*old.ledger_by_owner.items(), *part.ledger_by_owner.items()):
        mine = data.ledger_by_owner.setdefault(key, {})
        for b, v in buckets.items():
            mine[b] = mine.get(b, 0.0) + v
    data.ledger = job_ledger(data.ledger_by_owner, data.job_owners)
    data.notes = part.notes
    data.unreadable = set(part.unreadable)  # as the agents say now
    data.conflicts = claims.roll(old.conflicts, part.conflicts, start)
    return data
