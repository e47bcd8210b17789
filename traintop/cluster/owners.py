"""Whose processes hold each GPU of a node, for the agent's owner series: each GPU process's
user, job (Slurm or torchrun) and pod, read from /proc by collectors/whose.py (cached per PID by
collectors/owner_cache.py) and grouped.
"""

from __future__ import annotations

from traintop.collectors.owner_cache import OwnerCache
from traintop.samples import Frame


class GpuOwners(OwnerCache):
    def of(self, frame: Frame) -> tuple[tuple, ...]:
        """(gpu, user, job, pod, namespace, container, bytes held, SM share % or None) per GPU and owner."""
        now = self.clock()
        rows: dict[tuple, list] = {}
        seen = set()
        for g in frame.gpus:
            for p in g.processes:
                seen.add(p.pid)
                o = self._owner(p.pid, now)
                key = (g.index, o.user or "", o.slurm_job or o.run_id or "", o.pod or "", o.namespace or "",
                       (o.container or "")[:12])
                acc = rows.setdefault(key, [0, None])
                acc[0] += p.used_bytes or 0
                if p.sm_util is not None:
                    acc[1] = (acc[1] or 0.0) + p.sm_util
        self._forget_all_but(seen)
        return tuple((*key, held, None if sm is None else min(100.0, sm)) for key, (held, sm) in sorted(rows.items()))
