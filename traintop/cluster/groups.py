"""The cluster view's GPUs grouped by job or by user: what each holds now and what it held idle.

Read from the agents' owner series (``traintop_gpu_owner_memory_bytes``, fetch.py's
``ClusterData.owners``). A GPU belongs to every group whose processes hold memory on it at the
window's end; GPU-hours held idle over the window are the report's ``idle_hours_held`` (one
formula, traintop.waste), added up per group.

A job is one owner's (claims.py): where processes of several users use one job id (the
environment's SLURM_JOB_ID is anyone's to set), the owner the host vouches for keeps it and the
others are their own group, ``4242 (uid 1001)``; two pods claiming one name are told apart by
their uid.
"""

from __future__ import annotations

from dataclasses import dataclass

from traintop.cluster import claims
from traintop.cluster.fetch import ClusterData, OwnerLabels
from traintop.cluster.report import idle_hours_held
from traintop.rules.config import DEFAULT, Thresholds

GROUPINGS = ("host", "job", "user")


@dataclass(frozen=True)
class Held:
    """One owner's hold on one GPU, over the window shown."""

    host: str
    gpu: int
    who: OwnerLabels
    bytes_now: float | None  # what its processes hold at the window's end (None: no longer there)
    idle_hours: float  # GPU-hours it held this GPU while the GPU did nothing
    job: str = ""  # the job (or pod) it is part of: one owner's (job_names)


@dataclass(frozen=True)
class GroupLine:
    name: str  # the job or the user; "" where the agent could not tell
    gpus: int  # GPUs its processes hold now
    hosts: int
    util: float | None  # mean utilization of those GPUs now, 0..1
    mem_held: float  # bytes its processes hold now
    idle_hours: float  # GPU-hours held idle over the window


def held_of(data: ClusterData, config: Thresholds = DEFAULT) -> tuple[Held, ...]:
    idle = idle_hours_held(data, config)
    last = data.grid[-1] if data.grid else data.end
    now_from = last - 2 * data.step  # a scrape that landed late still counts as now
    name = job_names(data)
    out = []
    for (host, gpu), owners in sorted(data.owners.items()):
        for who, vals in owners:
            t = max(vals) if vals else None
            out.append(Held(host, gpu, who, vals[t] if t is not None and t >= now_from else None,
                            idle.get((host, gpu, who), 0.0), name(who)))
    return tuple(out)


def _pod(who: OwnerLabels) -> tuple[str, str]:
    """(a pod's name as its processes claim it, namespace/name; the pod's uid, or its user)."""
    name = f"{who.namespace}/{who.pod}" if who.pod and who.namespace else who.pod
    uid = "".join(c for c in who.pod_uid[:8] if c in "0123456789abcdef-")
    return name, f"pod {uid}" if uid else who.claim()[1]


def job_names(data: ClusterData):
    """``name(who)``: the job an owner's processes are part of, else their pod; one owner's each
    (data.job_owners: the ranks' and ledgers' claims read with these)."""
    jobs = claims.JobOwners().merged(data.job_owners)
    pods = claims.JobOwners()
    for owners in data.owners.values():
        for who, vals in owners:
            job, owner, vouched = who.claim()
            if job:
                jobs.see(job, owner, vouched, span=claims.times(vals))
            elif who.pod:
                pods.see(*_pod(who))

    def name(who: OwnerLabels) -> str:
        job, owner, _ = who.claim()
        if job:
            return jobs.name(job, owner)
        return pods.name(*_pod(who)) if who.pod else ""

    return name


def group_name(h: Held, by: str) -> str:
    """A job: the Slurm job or torchrun run, else the pod (namespace/name), one owner's. A user: the user."""
    return h.who.user if by == "user" else h.job


def group_lines(held: tuple[Held, ...], util: dict[tuple[str, int], float | None], by: str,
                hosts: set[str] | None = None) -> tuple[GroupLine, ...]:
    """``held`` grouped ``by`` job or user (``hosts``: those only), the most GPU-hours held idle
    first, then the most GPUs. ``util``: each GPU's utilization now."""
    gpus: dict[str, set] = {}
    mem: dict[str, float] = {}
    hours: dict[str, float] = {}
    for h in held:
        if hosts is not None and h.host not in hosts:
            continue
        name = group_name(h, by)
        hours[name] = hours.get(name, 0.0) + h.idle_hours
        gpus.setdefault(name, set())
        if h.bytes_now:
            gpus[name].add((h.host, h.gpu))
            mem[name] = mem.get(name, 0.0) + h.bytes_now
    out = []
    for name, keys in gpus.items():
        if not keys and not hours[name]:
            continue  # gone before the window's end, having held nothing idle
        utils = [u for k in keys if (u := util.get(k)) is not None]
        out.append(GroupLine(name, len(keys), len({host for host, _ in keys}),
                             sum(utils) / len(utils) if utils else None, mem.get(name, 0.0), hours[name]))
    out.sort(key=lambda g: (-g.idle_hours, -g.gpus, g.name))
    return tuple(out)
