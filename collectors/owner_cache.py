"""Whose each GPU process is, for the live sampler and the agent: collectors/whose.py, cached per process.

A process is looked up once, when NVML first lists it, and kept until it leaves the GPUs or its
PID names another process: a PID is reused only after its process has ended, so the cache holds a
pidfd of each process it looked up (``pidfd_open``), and one poll of them all a sample says which
ended. Where a pidfd cannot be had (an older kernel, a /proc that is not this host's, a test's
fake /proc), the process's start time (``/proc/PID/stat``) is its identity, compared every sample;
a PID with neither (not visible from here) is looked up again every ``RECHECK_S``. The cache holds
at most the GPU processes of now, and a sample in the steady state reads no /proc file.
"""

from __future__ import annotations

import dataclasses
import os
import select
import time

from traintop.collectors.procread import read_file
from traintop.collectors.whose import PROC, in_nested_pid_namespace, whose
from traintop.samples import GpuProcess, GpuSample, Owner

RECHECK_S = 60.0


def start_time(pid: int, proc: str = PROC) -> int | None:
    """When the process began (clock ticks after boot, ``/proc/PID/stat`` field 22); None: no such process."""
    raw = read_file(f"{proc}/{pid}/stat", 4096)
    if not raw:
        return None
    fields = raw.rpartition(b")")[2].split()  # the name before it may hold spaces and parentheses
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@dataclasses.dataclass(slots=True)
class _Known:
    owner: Owner
    when: float
    start: int | None = None  # its start time, where no pidfd watches it
    pidfd: int | None = None


class OwnerCache:
    """``lookup(pid, gpu_process=True, nested=...)`` -> Owner: ``whose`` (tests give it a /proc root,
    ``proc``, where start times are read instead of pidfds)."""

    def __init__(self, lookup=whose, clock=time.monotonic, nested: bool | None = None, proc: str = PROC) -> None:
        self.lookup = lookup
        self.clock = clock
        self.nested = in_nested_pid_namespace() if nested is None else nested
        self.proc = proc
        self._known: dict[int, _Known] = {}
        self._by_fd: dict[int, int] = {}  # pidfd -> PID
        self._poll = select.poll()
        self.lookups = 0

    def known(self, pid: int) -> Owner | None:
        """The owner looked up for ``pid`` so far (None: none yet); no /proc read, any thread."""
        got = self._known.get(pid)
        return got.owner if got is not None else None

    def _pidfd(self, pid: int) -> int | None:
        if self.proc != PROC or not hasattr(os, "pidfd_open"):
            return None
        try:
            return os.pidfd_open(pid)
        except OSError:  # gone, not visible from here, or not allowed (seccomp, an old kernel)
            return None

    def _look_up(self, pid: int, now: float) -> Owner:
        self.lookups += 1
        fd = self._pidfd(pid)
        start = None if fd is not None else start_time(pid, self.proc)
        owner = self.lookup(pid, gpu_process=True, nested=self.nested)
        if fd is not None:
            if self._ended(fd):  # it ended while read: what was read may be another's; asked again next time
                os.close(fd)
                return owner
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = pid
        elif start is not None and start_time(pid, self.proc) != start:
            return owner
        self._known[pid] = _Known(owner, now, start, fd)
        return owner

    @staticmethod
    def _ended(fd: int) -> bool:
        p = select.poll()
        p.register(fd, select.POLLIN)
        return bool(p.poll(0))

    def _drop(self, pid: int) -> None:
        got = self._known.pop(pid, None)
        if got is not None and got.pidfd is not None:
            self._poll.unregister(got.pidfd)
            del self._by_fd[got.pidfd]
            os.close(got.pidfd)

    def _forget_ended(self, now: float) -> None:
        """Drop the processes that ended (their PIDs may name others now), and those due a recheck."""
        if self._by_fd:
            for fd, _ in self._poll.poll(0):
                self._drop(self._by_fd[fd])
        for pid, got in list(self._known.items()):
            if got.pidfd is not None:
                continue
            if got.start is not None:
                if start_time(pid, self.proc) != got.start:
                    self._drop(pid)
            elif now - got.when >= RECHECK_S:
                self._drop(pid)

    def _owner(self, pid: int, now: float) -> Owner:
        got = self._known.get(pid)
        return got.owner if got is not None else self._look_up(pid, now)

    def _forget_all_but(self, seen: set[int]) -> None:
        for pid in [pid for pid in self._known if pid not in seen]:
            self._drop(pid)

    def attach(self, gpus: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
        """``gpus`` with each process's owner filled in (a sample whose processes already carry the
        right owners, as the NVML collector puts them from ``known``, is passed on as it is)."""
        now = self.clock()
        self._forget_ended(now)
        seen: set[int] = set()
        out = []
        changed = False
        for g in gpus:
            if g.processes:
                procs = list(g.processes)
                fresh = False
                for k, p in enumerate(procs):
                    seen.add(p.pid)
                    owner = self._owner(p.pid, now)
                    if p.owner is not owner:
                        procs[k] = GpuProcess(p.pid, p.used_bytes, p.sm_util, p.mem_util, p.enc_util, p.dec_util,
                                              owner=owner)
                        fresh = True
                if fresh:
                    g = dataclasses.replace(g, processes=tuple(procs))
                    changed = True
            out.append(g)
        self._forget_all_but(seen)
        return tuple(out) if changed else gpus

    def close(self) -> None:
        for pid in list(self._known):
            self._drop(pid)
