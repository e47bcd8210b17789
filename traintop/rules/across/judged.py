"""The cross-host rules judged instant by instant by the engine (see the package's docstring).

Each says, at one instant of the grid (``ctx.now``), for which job, rank or node its condition
holds (``Verdict.host``: the node it is about); the engine holds and releases. Once a finding's
time is known, ``describe`` says it with the numbers over that time and, for a lagging rank or
node, why, from that host's own data (its input wait, its clocks, its agent's findings).
"""

from __future__ import annotations

from typing import Iterable

from traintop.findings import Finding, Severity
import traintop.rules.across.figures as F
from traintop.rules.across.grid import Across
from traintop.rules.config import DEFAULT
from traintop.rules.declaration import CLUSTER
from traintop.rules.engine import RuleContext, Verdict
from traintop.samples import reason_names

MIN_LAG_S = 0.005  # a step this much slower at least: below, timer noise of quick steps
# An agent's verdicts on a GPU of a job that has a straggler: the waiting ranks' GPUs idle (or
# spin) for it, the straggler's own starves (the cause its finding names).
_WAITING_LOOKS_LIKE = ("starvation", "underuse", "idle_gpu")


class GridRule:
    """A cross-host rule judged on the grid: its declaration, and its hold on a grid of ``step``."""

    id: str
    title: str
    severity: Severity
    remedies: tuple[str, ...]
    scope = CLUSTER
    explains: tuple[str, ...] = ()  # the agents' (single-host) rules whose verdicts on its job's GPUs it explains
    defers_to: tuple[str, ...] = ()
    now_s = None  # a verdict at an instant of the grid is about that instant
    after_the_fact = True

    def __init__(self, step: float = 1.0, hold: float = DEFAULT.cluster_hold_s) -> None:
        self.raise_after = max(0.0, hold - step)  # each instant stands for its step
        self.clear_after = 2.5 * step  # gaps of up to two steps bridged

    def evaluate(self, ctx: RuleContext) -> Iterable[Verdict]:
        raise NotImplementedError

    def describe(self, x: Across, f: Finding) -> str:
        """The evidence over the finding's time."""
        raise NotImplementedError


def _lagging(x: Across, t: float) -> dict[str, set[int]]:
    """job -> its ranks that lag at ``t``: a step ``cluster_straggler_ratio`` times the job's pace, or
    in a synchronous job (equal step times), the rank that waits for its data while the others wait for it."""
    ratio = x.config.cluster_straggler_ratio
    out: dict[str, set[int]] = {}
    for job, ranks in x.jobs.items():
        if len(ranks) < 2:
            continue
        steps = {r.rank: s for r in ranks if (s := r.step.get(t))}
        if len(steps) < 2:
            continue
        m = F.reference(steps.values())
        lag = {rk for rk, s in steps.items() if s >= ratio * m and s - m >= MIN_LAG_S}
        if max(steps.values()) < ratio * m:
            waits = {r.rank: w for r in ranks if (w := r.wait.get(t)) is not None}
            if len(waits) >= 2:
                lag.update(F.waiting_for_input(waits, x.config))
        if lag:
            out[job] = lag
    return out


def _lag_now(ctx: RuleContext) -> tuple[Across, list[tuple[str, str, list, bool]]]:
    """(host, job, its lagging ranks there, whether they are all its ranks of the job) at ``ctx.now``."""
    x: Across = ctx.across

    def compute() -> list:
        out = []
        for job, lag in _lagging(x, ctx.now).items():
            by_host = x.job_hosts[job]
            for host, mine in by_host.items():
                lagging = [r for r in mine if r.rank in lag]
                if lagging:
                    out.append((host, job, lagging, len(mine) > 1 and len(lagging) == len(mine) and len(by_host) > 1))
        return out
    return x, x.figure(("lag", ctx.now), compute)


class Straggler(GridRule):
    id, title, severity = "straggler", "Straggler rank", Severity.WARNING
    remedies = (
        "Look at the lagging rank's host: its input pipeline, its GPU clocks, other processes on it.",
        "If its loader starves: more DataLoader workers on that node, or a local copy of the data.",
        "Exclude a persistently slow node from the allocation (Slurm --exclude) and report it.",
    )
    explains = _WAITING_LOOKS_LIKE

    def evaluate(self, ctx: RuleContext) -> Iterable[Verdict]:
        _, lags = _lag_now(ctx)
        for host, job, lagging, whole_node in lags:
            if not whole_node:  # a node lags while all its ranks do: that is straggler_node's
                for r in lagging:
                    yield Verdict(f"job {job} rank {r.rank}", "", host=host)

    def describe(self, x: Across, f: Finding) -> str:
        a, b = f.start, f.end if f.end is not None else f.start
        about = x.job_of(f.host, f.subject)
        if about is None:
            return ""
        job, (r,) = about
        host, ratio = r.host, x.config.cluster_straggler_ratio
        own = F.mean(F.between(r.step, a, b))
        rest = [o for o in x.jobs[job] if o.rank != r.rank]
        med = F.median_step(x, rest, a, b)
        waiters = ""
        if _in_step(own, med, ratio):  # synchronous: the lag shows in what the ranks wait for, not the step time
            head = (f"rank {r.rank} of job {job} on {host} holds the job back: every rank steps at its pace "
                    f"({F.secs(own)} a step) and {_others_wait(len(rest))} for it in collectives")
            waiters = F.waiters(x, rest, a, b)
        else:
            head = (f"rank {r.rank} of job {job} on {host}: {F.secs(own)} a step vs a median of "
                    f"{F.secs(med)} over the other {len(rest)} ranks")
        return head + F.why(x, host, [r], a, b, rest) + waiters


class StragglerNode(GridRule):
    id, title, severity = "straggler_node", "Straggler node", Severity.WARNING
    remedies = Straggler.remedies
    explains = _WAITING_LOOKS_LIKE

    def evaluate(self, ctx: RuleContext) -> Iterable[Verdict]:
        _, lags = _lag_now(ctx)
        for host, job, _, whole_node in lags:
            if whole_node:
                yield Verdict(f"job {job}", "", host=host)

    def describe(self, x: Across, f: Finding) -> str:
        a, b = f.start, f.end if f.end is not None else f.start
        job, host_ranks = x.job_of(f.host, f.subject) or ("", [])
        host = f.host or ""
        others = [r for r in x.jobs.get(job, ()) if r.host != host]
        own = F.mean(v for r in host_ranks for v in F.between(r.step, a, b))
        med = F.median_step(x, others, a, b)
        head = (f"all {len(host_ranks)} ranks on {host} lag: {F.secs(own)} a step vs {F.secs(med)} on the other "
                f"{len(others)} ranks of job {job}")
        waiters = ""
        if _in_step(own, med, x.config.cluster_straggler_ratio):
            head = (f"all {len(host_ranks)} ranks on {host} hold job {job} back: every rank steps at their "
                    f"pace ({F.secs(own)} a step) and {_others_wait(len(others))} for them in collectives")
            waiters = F.waiters(x, others, a, b)
        return head + F.why(x, host, host_ranks, a, b, others) + waiters


def _in_step(own: float | None, med: float | None, ratio: float) -> bool:
    return own is not None and med is not None and own < ratio * med


def _others_wait(n: int) -> str:
    return "the other rank waits" if n == 1 else f"the other {n} ranks wait"


def _stall_window(x: Across) -> float:
    return max(x.config.cluster_stall_min_s, min(60.0, 10 * x.data.step))


class Stalled(GridRule):
    id, title, severity = "stalled_job", "Job stalled", Severity.CRITICAL
    remedies = (
        "Dump the ranks' stacks (py-spy dump --pid) to see where they wait: usually a collective.",
        "Set NCCL_DEBUG=INFO and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 so a hang becomes an error.",
        "Check for a dead or missing rank (a node that stopped reporting).",
    )

    def evaluate(self, ctx: RuleContext) -> Iterable[Verdict]:
        x: Across = ctx.across
        t, window = ctx.now, _stall_window(x)
        before = round(t - window, 3)
        for job, ranks in x.jobs.items():
            counted = 0
            for r in ranks:
                now = r.steps.get(t)
                if now is None:
                    continue
                then = r.steps.get(before)
                if then is None or now - then > 0:
                    counted = 0  # a rank that stepped, or without its count a window ago: not every rank is flat
                    break
                counted += 1
            if counted:
                yield Verdict(f"job {job}", "", since=t - window, host=_hosts_named(ranks))

    def describe(self, x: Across, f: Finding) -> str:
        window = _stall_window(x)
        a, b = f.start + window, f.end if f.end is not None else f.start
        job = f.subject.removeprefix("job ")
        ranks = x.jobs.get(job, [])
        hosts = sorted({r.host for r in ranks})
        util = F.mean(v for h in hosts for g in x.gpu_hosts.get(h, ()) for v in F.between(g.util, a, b))
        return (f"no rank of job {job} took a step for {b - a + window:.0f} s ({len(ranks)} ranks on "
                f"{len(hosts)} node(s)); their GPUs meanwhile: utilization {F.pct(util)}"
                + (" (a hung collective keeps GPUs busy)" if util is not None and util > 0.8 else ""))


def _hosts_named(ranks) -> str:
    hosts = sorted({r.host for r in ranks})
    return ",".join(hosts[:3]) + ("…" if len(hosts) > 3 else "")


class NodeStarving(GridRule):
    id, title, severity = "node_starving", "One node's loader starves the job", Severity.WARNING
    remedies = (
        "Compare that node's storage and CPU with the others (a slower mount, fewer cores, a busy neighbour).",
        "Raise DataLoader num_workers on that node, or stage the data on its local disk.",
    )
    # A node whose loader starves the job and the straggler it makes are one finding: the straggler's,
    # which names the rank and carries the cause.
    defers_to = (Straggler.id, StragglerNode.id)

    def evaluate(self, ctx: RuleContext) -> Iterable[Verdict]:
        x: Across = ctx.across
        t, c = ctx.now, x.config
        for job, by_host in x.job_hosts.items():
            if len(by_host) < 2 or not x.figure(("starving_possible", job), lambda: _any_waits(x, job)):
                continue  # a node's mean wait reaches the line only where one of its ranks' does
            per = {h: w for h, mine in by_host.items() if (w := F.mean(r.wait.get(t) for r in mine)) is not None}
            if len(per) < 2:
                continue
            vals = sorted(per.values())
            for h, w in per.items():
                if w >= c.cluster_node_starving_input_wait and \
                        w >= c.cluster_node_starving_ratio * F.median_without(vals, w) and \
                        not _straggler_on(ctx, job, h, by_host[h]):
                    yield Verdict(f"job {job}", "", host=h)

    def describe(self, x: Across, f: Finding) -> str:
        a, b, h = f.start, f.end if f.end is not None else f.start, f.host or ""
        job = f.subject.removeprefix("job ")
        ranks = x.jobs.get(job, [])
        mine = [r for r in ranks if r.host == h]
        others = [r for r in ranks if r.host != h]
        w = F.mean(v for r in mine for v in F.between(r.wait, a, b))
        ow = F.mean(v for r in others for v in F.between(r.wait, a, b))
        cpu = F.mean(F.between(x.data.loader_cpu.get(h, {}), a, b))
        return (f"the {len(mine)} rank(s) on {h} wait for input {F.pct(w)} of the time, the other "
                f"{len(x.job_hosts.get(job, {})) - 1} node(s) {F.pct(ow)}"
                + (f"; {h}'s loader workers at {cpu * 100:.0f} % CPU" if cpu is not None else ""))


def _straggler_on(ctx: RuleContext, job: str, host: str, ranks) -> bool:
    """A straggler of ``job`` on ``host`` holds now or is up (``defers_to``)."""
    subjects = [(StragglerNode.id, f"job {job}")] + [(Straggler.id, f"job {job} rank {r.rank}") for r in ranks]
    return any(ctx.is_holding(rule, subject, host) or ctx.is_active(rule, subject, host) for rule, subject in subjects)


class SlowNode(GridRule):
    id, title, severity = "slow_node", "Slow node: all its GPUs clocked down", Severity.WARNING
    remedies = (
        "Check that node's cooling and power (nvidia-smi -q -d PERFORMANCE shows why clocks are held).",
        "Drain it for maintenance if it persists: the whole job runs at its pace.",
    )

    def evaluate(self, ctx: RuleContext) -> Iterable[Verdict]:
        x: Across = ctx.across
        c, t = x.config, ctx.now
        if len(x.gpu_hosts) < 2:
            return
        if not x.figure(("slow_node_possible",), lambda: _any_clocked_down(x)):
            return  # no GPU of any host ever below the line in this read: nothing to look at, instant by instant
        busy = c.cluster_slow_node_min_util / 100  # the grid's utilization is a ratio
        per = {}
        for h, gpus in x.gpu_hosts.items():
            ratios = [r for g in gpus if (g.util.get(t) or 0) >= busy and (r := g.clock_ratio.get(t)) is not None]
            if ratios:
                per[h] = max(ratios)  # every busy GPU below the line: the highest of them is
        if len(per) < 2:
            return
        vals = sorted(per.values())
        for h, top in per.items():
            if top < c.cluster_slow_node_clock_frac and F.median_without(vals, top) >= c.cluster_slow_node_others_clock_frac:
                yield Verdict(h, "", host=h)

    def describe(self, x: Across, f: Finding) -> str:
        a, b, h = f.start, f.end if f.end is not None else f.start, f.host or ""
        gpus = x.gpu_hosts.get(h, [])
        clk = F.mean(v for g in gpus for v in F.between(g.clock_ratio, a, b))
        temp = max((v for g in gpus for v in F.between(g.temp, a, b)), default=None)
        reasons = sorted({n for g in gpus for v in F.between(g.reasons, a, b) for n in reason_names(int(v))} - {"idle"})
        return (f"all {len(gpus)} GPUs of {h} run at {F.pct(clk)} of their maximum SM clock while the other "
                f"nodes' stay at full clock" + (f"; peak {temp:.0f} °C" if temp is not None else "")
                + (f"; clock-event reasons: {', '.join(reasons)}" if reasons else ""))


def _any_clocked_down(x: Across) -> bool:
    line = x.config.cluster_slow_node_clock_frac
    return any(g.clock_ratio and min(v for v in g.clock_ratio.values() if v is not None) < line
               for gpus in x.gpu_hosts.values() for g in gpus if any(v is not None for v in g.clock_ratio.values()))


def _any_waits(x: Across, job: str) -> bool:
    line = x.config.cluster_node_starving_input_wait
    return any(max((v for v in r.wait.values() if v is not None), default=0.0) >= line for r in x.jobs.get(job, ()))
