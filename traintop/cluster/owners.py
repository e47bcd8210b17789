"""Whose processes hold each GPU of a node, for the agent's owner series: each GPU process's
user, job (Slurm or torchrun) and pod, read from /proc by collectors/whose.py (cached per PID by
collectors/owner_cache.py) and grouped. A job is ``hpc_job`` only where the host vouches for it
(Slurm's cgroup); the environment's job, pod and namespace are the processes' claims.
"""

from __future__ import annotations

from traintop.cluster.exporter import OwnerRow
from traintop.collectors.owner_cache import OwnerCache
from traintop.samples import Frame


class GpuOwners(OwnerCache):
    def of(self, frame: Frame) -> tuple[OwnerRow, ...]:
        """Per GPU and owner: who (the host's word apart from the processes' own), what they hold."""
        now = self.clock()
        self._forget_ended(now)
        rows: dict[OwnerRow, list] = {}
        seen = set()
        for g in frame.gpus:
            for p in g.processes:
                seen.add(p.pid)
                o = self._owner(p.pid, now)
                job = o.slurm_job or o.run_id or ""
                vouched = o.job_from == "cgroup"
                key = OwnerRow(g.index, o.user or "", "" if o.uid is None else str(o.uid), job if vouched else "",
                               "" if vouched else job, o.pod_uid or "", o.pod or "", o.namespace or "",
                               (o.container or "")[:12], 0, None)
                acc = rows.setdefault(key, [0, None])
                acc[0] += p.used_bytes or 0
                if p.sm_util is not None:
                    acc[1] = (acc[1] or 0.0) + p.sm_util
        self._forget_all_but(seen)
        return tuple(key._replace(held=held, sm=None if sm is None else min(100.0, sm))
                     for key, (held, sm) in sorted(rows.items()))
