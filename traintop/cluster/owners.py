"""Whose processes hold each GPU of a node, for the agent's owner series: each GPU process's
user, job (Slurm or torchrun) and pod, read from /proc by collectors/whose.py and grouped.

A PID is looked up once and again every ``RECHECK_S`` (a PID can be reused), and forgotten when
it leaves the GPUs, so a node with many short processes costs a few /proc reads a second.
"""

from __future__ import annotations

import time

from traintop.collectors.whose import Owner, in_nested_pid_namespace, whose
from traintop.samples import Frame

RECHECK_S = 60.0


class GpuOwners:
    def __init__(self, lookup=whose, clock=time.monotonic, nested: bool | None = None) -> None:
        self.lookup = lookup
        self.clock = clock
        self.nested = in_nested_pid_namespace() if nested is None else nested
        self._known: dict[int, tuple[Owner, float]] = {}

    def _owner(self, pid: int, now: float) -> Owner:
        got = self._known.get(pid)
        if got is None or now - got[1] >= RECHECK_S:
            got = self._known[pid] = (self.lookup(pid, gpu_process=True, nested=self.nested), now)
        return got[0]

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
        for pid in [pid for pid in self._known if pid not in seen]:
            del self._known[pid]
        return tuple((*key, held, None if sm is None else min(100.0, sm)) for key, (held, sm) in sorted(rows.items()))
