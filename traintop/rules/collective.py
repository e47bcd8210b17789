"""Which GPUs of a job wait in a collective (NCCL all-reduce) for another: shared by the straggler
and stall rules, and by the rules that must not judge a waiting GPU by its own numbers.

A rank that reaches an all-reduce before its peers launches the NCCL kernel and the kernel spins
until they arrive: NVML's utilization reads ~100 % (a kernel is running), yet the GPU draws
little power and few SMs are active (measured on two H200s: 100 % utilization at 230 W of
700 W with SMs 28 % active, while the slow rank's GPU read 11 %). A GPU computing at 100 %
draws far more. So: among the GPUs of one job, a GPU that reads busy without the power or SM
activity of work, beside one that mostly idles, is waiting for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from traintop.rules.engine import RuleContext
from traintop.store import mean
from traintop.units import GiB

SPIN_MIN_UTIL = 80.0  # a waiting GPU reads at least this busy
SPIN_MAX_SM = 40.0  # with GPM: a GPU computing in earnest keeps most SMs busy (balanced DDP: 93 %)
SPIN_MAX_POWER_FRAC = 0.45  # without GPM: of the power limit (balanced DDP: 99 %)
SPIN_MAX_POWER_RATIO = 1.35  # without a limit either: a spinning GPU draws about what an idle peer does
LAG_GAP = 40.0  # the lagging GPU reads at least this many points below the waiting one
LAG_MIN_RECENT_UTIL = 2.0  # ...and still works now and then
CONTEXT_BYTES = GiB  # memory in use that means a job holds the GPU (a CUDA context and more)
LOOKBACK_S = 300.0
REMOTE_MIN_UTIL = 30.0  # a GPU waiting for a rank on another host reads at least this busy ...
REMOTE_MAX_SM_SHARE = 0.25  # ... with SMs active this share of it at most (two H200 nodes: 47 % busy, SMs 3.9 %)


@dataclass(frozen=True)
class Load:
    index: int
    util: float
    power: float | None
    limit: float | None
    sm: float | None  # GPM SM activity, where measured


def job_gpus(ctx: RuleContext) -> list[int]:
    """The GPUs of the watched job: its ranks' devices and NVML processes where the source knows
    them; in a log without process lists, every GPU with memory in use. Worked out once an
    evaluation (several rules ask); the list is shared: read it, never change it."""
    got = ctx._cache.get("job_gpus")
    if got is None:
        got = ctx._cache["job_gpus"] = _job_gpus(ctx)
    return got


def _job_gpus(ctx: RuleContext) -> list[int]:
    frame = ctx.frame
    if frame is None:
        return []
    gpus = frame.gpus
    proc = ctx.process
    pids = {r.pid for _, r in ctx.ranks()}
    if proc is not None:
        pids |= {proc.pid} | {m.pid for m in proc.members}
    with_procs = [g for g in gpus if g.processes]
    if pids and with_procs:
        return [g.index for g in gpus if any(p.pid in pids for p in g.processes)]
    devices = {r.device for _, r in ctx.ranks() if r.device is not None}
    if devices:
        return sorted(devices & {g.index for g in gpus})
    if with_procs:
        return [g.index for g in with_procs]
    if any(g.mem_used is not None for g in gpus):
        return [g.index for g in gpus if g.mem_used is not None and g.mem_used >= CONTEXT_BYTES]
    # no memory either (dmon without -s m): the GPUs that did some work lately
    return [g.index for g in gpus if max(ctx.gpu_window(g.index, "util", LOOKBACK_S), default=0) >= 5]


def loads(ctx: RuleContext, window_s: float, gpus: list[int] | None = None, min_n: int = 5) -> dict[int, Load]:
    out = {}
    latest = {g.index: g for g in ctx.gpus()}
    for i in job_gpus(ctx) if gpus is None else gpus:
        util = ctx.gpu_window(i, "util", window_s)
        mean_util = mean(util)
        if mean_util is None or len(util) < min_n:
            continue
        sm = ctx.gpu_window(i, "sm_active", window_s)
        g = latest.get(i)
        out[i] = Load(i, mean_util, ctx.gpu_mean(i, "power_w", window_s), g.power_limit_w if g else None,
                      mean(sm) if len(sm) >= min_n else None)
    return out


def looks_spinning(load: Load, peers: list[Load]) -> bool:
    """Busy by utilization, idle by what the GPU does."""
    if load.util < SPIN_MIN_UTIL:
        return False
    if load.sm is not None:
        return load.sm < SPIN_MAX_SM
    if load.power is None:
        return False
    if load.limit:
        return load.power < SPIN_MAX_POWER_FRAC * load.limit
    others = [p.power for p in peers if p.power is not None and p.index != load.index]
    return bool(others) and load.power < SPIN_MAX_POWER_RATIO * min(others)


@dataclass(frozen=True)
class Waits:
    waiting: dict[int, Load]  # GPUs spinning in a collective
    lagging: dict[int, Load]  # the GPUs they wait for

    def involves(self, index: int) -> bool:
        return index in self.waiting or index in self.lagging


def collective_waits(ctx: RuleContext, window_s: float, min_n: int = 5) -> Waits | None:
    """GPUs of one job that wait for another in a collective, and those they wait for; None if none
    (at once with fewer than two GPUs). Worked out once an evaluation for each window (the power
    cap, starvation, underuse and straggler rules all ask)."""
    if len(ctx.gpus()) < 2:
        return None
    key = ("collective_waits", window_s, min_n)
    if key not in ctx._cache:
        ctx._cache[key] = _collective_waits(ctx, window_s, min_n)
    return ctx._cache[key]


def _collective_waits(ctx: RuleContext, window_s: float, min_n: int) -> Waits | None:
    ld = loads(ctx, window_s, min_n=min_n)
    if len(ld) < 2:
        return None
    peers = list(ld.values())
    waiting = {i: x for i, x in ld.items() if looks_spinning(x, peers)}
    if not waiting:
        return None
    top = min(x.util for x in waiting.values())
    # the slow rank still works now and then; a GPU with nothing at all for 10 s is a stall, not a straggler
    lagging = {i: x for i, x in ld.items() if i not in waiting and x.util <= top - LAG_GAP
               and (ctx.gpu_mean(i, "util", 10.0) or 0.0) >= LAG_MIN_RECENT_UTIL}
    return Waits(waiting, lagging) if lagging else None


def waits_for_another_host(ctx: RuleContext, gpu: int, window_s: float) -> bool:
    """This GPU's rank belongs to a job with ranks on other hosts (its world size is beyond the ranks of
    its job seen here) and the GPU reads busy while its SMs barely work: an NCCL kernel spinning in a
    collective, waiting for a rank elsewhere (the cross-host view names it). Measured on two H200
    nodes, one rank each: the waiting rank's GPU 47 % busy with SMs 3.9 % active, the straggler's
    6 % busy (3.6 %)."""
    ranks = [r for _, r in ctx.feed(gpu).ranks]
    if not ranks:
        return False
    jobs = {(r.job, r.uid) for r in ranks}
    here = sum(1 for _, r in ctx.ranks() if (r.job, r.uid) in jobs and r.cuda)
    if max(r.world_size or 0 for r in ranks) <= here:
        return False
    util, sm = ctx.gpu_mean(gpu, "util", window_s), ctx.gpu_mean(gpu, "sm_active", window_s)
    return util is not None and sm is not None and util >= REMOTE_MIN_UTIL and sm <= REMOTE_MAX_SM_SHARE * util
