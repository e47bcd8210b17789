"""Which rank process and which loader workers feed each GPU, and how busy those workers are.

A DDP job runs one process per rank, each with its own DataLoader workers (forked from it:
its children). So each GPU is judged by its own rank's workers, input wait and step time,
never by the whole tree's. A rank is placed on a GPU by NVML's process list (the PID that
holds memory there), else by its probe's device; a worker belongs to the nearest ancestor
that is one of those rank processes. Without parent PIDs (recordings made before they were
kept) the tree's workers are attributed only when the job uses a single GPU.

``WorkerLoad`` is the one definition of "loader workers at N % CPU" that the starvation
rule quotes and the process panel shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traintop.metrics import rank_id
from traintop.samples import Frame, ProcInfo, RankSample


@dataclass(frozen=True)
class WorkerLoad:
    """Loader workers and their CPU, in % of one core (a worker may use more than one)."""

    workers: tuple[ProcInfo, ...]
    busy_cpu: float  # the threshold: a worker at or above it is saturated

    @property
    def count(self) -> int:
        return len(self.workers)

    @property
    def busy(self) -> tuple[ProcInfo, ...]:
        return tuple(w for w in self.workers if (w.cpu_percent or 0) >= self.busy_cpu)

    @property
    def busy_mean(self) -> float | None:
        busy = self.busy
        return sum(w.cpu_percent or 0 for w in busy) / len(busy) if busy else None

    @property
    def saturated(self) -> bool:
        """At least half of them (and one) saturated: the loader is the limit."""
        return bool(self.workers) and len(self.busy) >= max(1, self.count // 2)

    def sentence(self) -> str:
        return f"{len(self.busy)} of {self.count} loader workers sit at {self.busy_mean:.0f} % CPU"


@dataclass(frozen=True)
class GpuFeed:
    """What feeds one GPU: its rank processes (probed or not) and their loader workers."""

    gpu: int
    pids: frozenset[int]  # the job's processes holding memory on this GPU, and its ranks there
    ranks: tuple[tuple[str, RankSample], ...] = ()  # (series prefix / subject, probe sample)
    workers: tuple[ProcInfo, ...] = ()
    main: tuple[ProcInfo, ...] = field(default=())  # the rank processes themselves (their own CPU)


def rank_gpu(rank: RankSample, frame: Frame) -> int | None:
    """The NVML index of the GPU a probed rank uses: where NVML lists its PID, else its probe's device."""
    for g in frame.gpus:
        if any(p.pid == rank.pid for p in g.processes):
            return g.index
    if rank.cuda and len(frame.gpus) == 1:
        return frame.gpus[0].index
    if rank.cuda and rank.device is not None and any(g.index == rank.device for g in frame.gpus):
        return rank.device
    return None


def gpu_feeds(frame: Frame | None) -> dict[int, GpuFeed]:
    """Each GPU's feed in ``frame`` (GPUs the attached job does not use get an empty one)."""
    if frame is None:
        return {}
    proc = frame.process
    members = {m.pid: m for m in proc.members} if proc is not None and proc.alive else {}
    tree = set(members) | ({proc.pid} if proc is not None else set())
    pids: dict[int, set[int]] = {g.index: {p.pid for p in g.processes if not tree or p.pid in tree}
                                 for g in frame.gpus}
    ranks: dict[int, list] = {g.index: [] for g in frame.gpus}
    for k, r in enumerate(frame.ranks):
        gpu = rank_gpu(r, frame)
        if gpu is not None:
            ranks[gpu].append((rank_id(r, k), r))
            pids[gpu].add(r.pid)
    owner = {pid: gpu for gpu, ps in pids.items() for pid in ps}
    workers: dict[int, list[ProcInfo]] = {g.index: [] for g in frame.gpus}
    unplaced: list[ProcInfo] = []
    for m in members.values():
        if not m.is_loader_worker:
            continue
        gpu = _fed_gpu(m, members, owner)
        (workers[gpu] if gpu is not None else unplaced).append(m)
    used = [i for i, ps in pids.items() if ps]
    if unplaced and len(used) == 1:
        workers[used[0]].extend(unplaced)  # one GPU: the job's workers can feed only it
    return {i: GpuFeed(i, frozenset(pids[i]), tuple(ranks[i]), tuple(workers[i]),
                       tuple(members[p] for p in sorted(pids[i]) if p in members))
            for i in pids}


def _fed_gpu(worker: ProcInfo, members: dict[int, ProcInfo], owner: dict[int, int]) -> int | None:
    """The GPU of the nearest ancestor of ``worker`` that uses one (None: unknown parents)."""
    pid, seen = worker.ppid, set()
    while pid is not None and pid not in seen:
        if pid in owner:
            return owner[pid]
        seen.add(pid)
        parent = members.get(pid)
        pid = parent.ppid if parent is not None else None
    return None
