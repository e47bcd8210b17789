"""What the cross-host rules judge: one read range of a cluster (``ClusterData``, every host's
series on Prometheus's grid), prepared once, and the figures several verdicts ask of it.

The engine plays the grid instant by instant (cluster/judge.py); at each one a rule reads
``ctx.across`` (this) at ``ctx.now``. The figures over a finding's time (its evidence) are asked
once per finding, and a large job's "the others" once per interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeAlias

from traintop.rules.config import DEFAULT, Thresholds

# cluster/fetch.py's ClusterData and RankData: read here, not imported (the cluster wing imports the rules)
ClusterData: TypeAlias = Any
RankData: TypeAlias = Any


@dataclass
class Across:
    data: ClusterData
    config: Thresholds = DEFAULT
    titles: dict = field(default_factory=dict)  # a single-host rule's id -> its title (an agent's warnings named)
    jobs: dict = field(default_factory=dict)  # job -> its ranks, by rank
    job_hosts: dict = field(default_factory=dict)  # job -> {host: its ranks there}
    gpu_hosts: dict = field(default_factory=dict)  # host -> its GPUs' data
    _figures: dict = field(default_factory=dict)  # what several verdicts or findings ask, computed once
    _agent_warnings: dict | None = None

    @classmethod
    def of(cls, data: ClusterData, config: Thresholds = DEFAULT, titles: dict | None = None) -> "Across":
        a = cls(data, config, titles or {}, data.jobs())
        for job, ranks in a.jobs.items():
            by_host: dict = {}
            for r in ranks:
                by_host.setdefault(r.host, []).append(r)
            a.job_hosts[job] = by_host
        for (h, _), g in sorted(data.gpus.items()):
            a.gpu_hosts.setdefault(h, []).append(g)
        return a

    def figure(self, key: tuple, compute: Callable):
        """``compute()`` once for ``key`` in this judgement (a job's figure over an interval, an instant's lag)."""
        got = self._figures.get(key, _MISSING)
        if got is _MISSING:
            got = self._figures[key] = compute()
        return got

    def agent_warnings(self) -> dict:
        """host -> [(title, first, last)] of its agent's warnings."""
        if self._agent_warnings is None:
            found: dict = {}
            for f in self.data.findings:
                if f.severity in ("warning", "critical") and f.times:
                    found.setdefault(f.host, []).append((self.titles.get(f.rule, f.rule), f.times[0], f.times[-1]))
            self._agent_warnings = found
        return self._agent_warnings

    def job_of(self, host: str | None, subject: str) -> tuple[str, list[RankData]] | None:
        """The job a finding on ``host`` is about and its ranks it names there (a node's: all of them)."""
        for job, by_host in self.job_hosts.items():
            mine = by_host.get(host or "", ())
            if subject == f"job {job}":
                return job, list(mine)
            for r in mine:
                if subject == f"job {job} rank {r.rank}":
                    return job, [r]
        return None


_MISSING = object()
