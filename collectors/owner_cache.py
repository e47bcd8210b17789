"""Whose each GPU process is, for the live sampler and the agent: collectors/whose.py, cached per PID.

A PID is looked up once and again every ``RECHECK_S`` (a PID can be reused), and forgotten when
it leaves the GPUs, so the cache holds at most the GPU processes of now and a node with many
short processes costs a few /proc reads a second, not three files per process per sample.
"""

from __future__ import annotations

import dataclasses
import time

from traintop.collectors.whose import in_nested_pid_namespace, whose
from traintop.samples import GpuSample, Owner

RECHECK_S = 60.0


class OwnerCache:
    """``lookup(pid, gpu_process=True, nested=...)`` -> Owner: ``whose`` (tests give it a /proc root)."""

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

    def _forget_all_but(self, seen: set[int]) -> None:
        for pid in [pid for pid in self._known if pid not in seen]:
            del self._known[pid]

    def attach(self, gpus: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
        """``gpus`` with each process's owner filled in."""
        now = self.clock()
        seen: set[int] = set()
        out = []
        for g in gpus:
            if g.processes:
                seen.update(p.pid for p in g.processes)
                g = dataclasses.replace(g, processes=tuple(
                    dataclasses.replace(p, owner=self._owner(p.pid, now)) for p in g.processes))
            out.append(g)
        self._forget_all_but(seen)
        return tuple(out)
