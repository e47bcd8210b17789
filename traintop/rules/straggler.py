"""The straggler: one rank of a multi-GPU job is slow, and every other rank waits for it at each
all-reduce. The waiting GPUs read ~100 % utilization (the NCCL kernel spins) at low power and few
active SMs; the slow rank's GPU mostly idles. Neither GPU is "underused" by its batch size: the
step is as slow as its slowest rank.
"""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.collective import Load, Waits, collective_waits
from traintop.rules.declaration import HostRule
from traintop.rules.engine import HOLDS, WEAK, Verdict, RuleContext, Severity
from traintop.samples import THERMAL_REASONS, reason_names
from traintop.units import fmt_bytes


def _gpu_state(x: Load) -> str:
    text = f"GPU {x.index} {x.util:.0f} %"
    if x.power is not None:
        text += f" at {x.power:.0f} W" + (f" of {x.limit:.0f} W" if x.limit else "")
    if x.sm is not None:
        text += f", SMs {x.sm:.0f} % active"
    return text


def rank_on_gpu(ctx: RuleContext, index: int):
    """(subject, RankSample) of the probed rank on this GPU, or None."""
    frame = ctx.frame
    pids = {p.pid for g in frame.gpus if g.index == index for p in g.processes} if frame else set()
    for subject, r in ctx.ranks():
        if r.device == index or r.pid in pids:
            return subject, r
    return None


def process_on_gpu(ctx: RuleContext, index: int):
    """The job's process on this GPU (a member of the attached tree), or None."""
    proc, frame = ctx.process, ctx.frame
    if proc is None or frame is None:
        return None
    pids = {p.pid for g in frame.gpus if g.index == index for p in g.processes}
    rank = rank_on_gpu(ctx, index)
    if rank is not None:
        pids.add(rank[1].pid)
    return next((m for m in proc.members if m.pid in pids), None)


UNEXPLAINED = "nothing traintop sees explains it"


def _probed(ctx: RuleContext, seconds: float) -> bool:
    """Probes reported input waits over the last ``seconds``: the job runs with the probe."""
    return any(k.startswith("rank") and k.endswith(".input_wait") and ctx.values(k, seconds)
               for k in ctx.store.keys())


def why_slow(ctx: RuleContext, index: int, window_s: float) -> str | None:
    """What the data says about why the rank on GPU ``index`` is slow; None when the job runs with
    the probe but no rank reports for this GPU now (it is ending): the rest would only guess."""
    reasons = []
    rank = rank_on_gpu(ctx, index)
    if rank is None and _probed(ctx, window_s):
        return None
    wait = None
    if rank is not None:
        waits = ctx.rank_window(rank[0], "input_wait", window_s)
        wait = sum(waits) / len(waits) if len(waits) >= 3 else None
        if wait is not None and wait >= ctx.config.starvation_input_wait:
            reasons.append(f"its input: it waits for its next batch {wait * 100:.0f} % of the time (measured in "
                           "the job): its loader workers cannot keep up")
    member = process_on_gpu(ctx, index)
    cpu = member.cpu_percent if member is not None else None
    if not reasons and cpu is not None and cpu >= 50:
        where = ("it does not wait for input (loader wait {:.0f} %), so the time goes to CPU work in its own "
                 "step".format(wait * 100) if wait is not None else "CPU work in its step or its input path")
        reasons.append(f"its process is busy on the CPU ({cpu:.0f} % of a core) while its GPU idles: {where}")
    masks = ctx.gpu_reasons(index, window_s)
    hot = [m for m in masks if m & THERMAL_REASONS]
    if masks and len(hot) >= 0.25 * len(masks):
        names = ", ".join(reason_names(hot[-1] & THERMAL_REASONS))
        reasons.append(f"its clocks are held down ({names}) {len(hot) / len(masks) * 100:.0f} % of the time")
    frame = ctx.frame
    proc = ctx.process
    if frame is not None and proc is not None:
        mine = {proc.pid} | {m.pid for m in proc.members}
        others = [p for g in frame.gpus if g.index == index for p in g.processes if p.pid not in mine]
        if others:
            held = sum(p.used_bytes or 0 for p in others)
            reasons.append(f"{len(others)} other process(es) share its GPU ({fmt_bytes(held)})")
    if not reasons:
        return (UNEXPLAINED + " (no input wait, throttling or other process): look for work only "
                "this rank does (logging, evaluation, checkpoints) or uneven batches")
    return "; ".join(reasons)


def step_cost(ctx: RuleContext, waits: Waits, window_s: float) -> str:
    """The step time and the share of it that the GPUs compute (the slow rank's GPU busy share)."""
    step = None
    for subject, _ in ctx.ranks():
        st = ctx.rank_window(subject, "step_time", window_s)
        if st:
            step = sorted(st)[len(st) // 2]
            break
    busy = max(x.util for x in waits.lagging.values()) / 100
    if step:
        return (f"each step takes {step:.2f} s (measured in the job), of which the GPUs compute about "
                f"{busy * step:.2f} s: ~{(1 - busy) * step:.2f} s of every step is the wait for the slow rank")
    return f"the GPUs compute only ~{busy * 100:.0f} % of the time; the rest is the wait for the slow rank"


class Straggler(HostRule):
    id = "straggler"
    title = "A slow rank holds back the others"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 20.0
    explains = ("underuse", "imbalance", "idle_gpu")  # the others wait for it
    defers_to = ("stall",)
    explains_all_gpus = True
    remedies = (
        "Find what only the slow rank does: its input pipeline (more DataLoader workers, faster decoding), "
        "CPU work in its step, logging or evaluation on rank 0 only.",
        "Check its GPU for throttling (clock-event reasons, temperature) and for other processes.",
        "Uneven batches (variable sequence lengths) make ranks wait for the slowest: bucket by length.",
        "Do not raise the waiting ranks' batch size: they are not underused, they wait.",
    )

    def evaluate(self, ctx: RuleContext):
        w = ctx.config.straggler_window_s
        if any(ctx.is_holding(r, gpu_subject(g.index)) for g in ctx.gpus() for r in self.defers_to):
            return  # nobody steps: that is a stall, not a slow rank
        waits = collective_waits(ctx, w)
        if waits is None:
            found = _busy_rank(ctx)  # ranks sharing GPUs: their processes tell the slow one
            if found is not None:
                yield found
            return
        # the last seconds too, or the numbers are of a job that is ending: keep the alert, not them
        recent = collective_waits(ctx, 6.0, min_n=3)
        for i, lag in sorted(waits.lagging.items()):
            rank = rank_on_gpu(ctx, i)
            who = f"{rank[1].label} (GPU {i})" if rank is not None else f"GPU {i}"
            waiting = ", ".join(_gpu_state(x) for x in waits.waiting.values())
            why = why_slow(ctx, i, w)
            text = (f"{who} lags and the others wait for it at every all-reduce: {waiting} — busy by utilization "
                    f"but not computing (spinning in a collective) — while {_gpu_state(lag)} over the last "
                    f"{w:.0f} s; {step_cost(ctx, waits, w)}. Why it is slow: {why or UNEXPLAINED}")
            # a vaguer reason (the job's processes going away at its end) never replaces a specific one
            specific = (why is not None and UNEXPLAINED not in why) or not ctx.is_active(self.id, gpu_subject(i))
            strong = specific and recent is not None and i in recent.lagging
            yield Verdict(gpu_subject(i), text, state=HOLDS if strong else WEAK)


BUSY_CPU = 85.0  # % of a core: the slow rank's process, working on the CPU in every step
WAITING_CPU = 50.0  # ... while the others sleep in the collective
SAME_STEP = 1.25  # synchronous ranks step together: their step times agree within this factor


def _busy_rank(ctx: RuleContext) -> Verdict | None:
    """Ranks that share GPUs (or whose GPUs NVML cannot tell apart): one rank's process is busy on the
    CPU in every step while the others' sleep, and all step together: the others wait for it."""
    proc = ctx.process
    if proc is None or not proc.alive:
        return None
    ranks = [(s, r) for s, r in ctx.ranks() if r.rank is not None and r.steps and r.step_time]
    if len(ranks) < 2:
        return None
    cpu = {m.pid: m.cpu_percent for m in proc.members}
    loads: dict[str, float] = {}
    for s, r in ranks:
        if (v := cpu.get(r.pid)) is None:
            return None
        loads[s] = v
    hot = [s for s, v in loads.items() if v >= BUSY_CPU]
    if len(hot) != 1 or any(v > WAITING_CPU for s, v in loads.items() if s != hot[0]):
        return None
    steps = [t for _, r in ranks if (t := r.step_time)]  # all of them: ranks have a step time
    if max(steps) > SAME_STEP * min(steps):
        return None
    subject = hot[0]
    slow = dict(ranks)[subject]
    if (slow.input_wait or 0) >= 0.3:
        return None  # it waits for its input: data starvation says so
    others = ", ".join(f"{r.label} {loads[s]:.0f} %" for s, r in ranks if s != subject)
    step = sorted(steps)[len(steps) // 2]
    return Verdict(subject, f"{slow.label} (PID {slow.pid}) is busy on the CPU ({loads[subject]:.0f} % of a core) "
                            f"while the other ranks' processes sleep ({others} of a core), and every rank steps "
                            f"once every {step:.2f} s: the others wait for {slow.label} at each all-reduce. "
                            f"Why it is slow: CPU work in its own step (input wait {(slow.input_wait or 0) * 100:.0f} %)")
