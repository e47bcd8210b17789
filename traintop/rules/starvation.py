"""Data starvation: the GPU waits for the input pipeline.

Signs: utilization that alternates between idle and busy (spiky), or low mean
utilization while loader workers or host cores are saturated. Point samples of
``utilization.gpu`` alias at low sampling rates, so where the source gives the
min/max of NVML's utilization sample buffer per tick, a tick that saw both idle
and busy counts as spiky on its own.
"""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.engine import Finding, RuleContext, Severity
from traintop.store import mean
from traintop.units import fmt_range


def _idle_gaps(pairs: list[tuple[float, float]], idle: float) -> list[float]:
    """Durations of the runs of idle samples, bounded by busy ones."""
    gaps, start, prev_t = [], None, None
    for t, v in pairs:
        if v < idle:
            if start is None:
                start = prev_t if prev_t is not None else t
        elif start is not None:
            gaps.append(t - start)
            start = None
        prev_t = t
    return gaps


def _idle_to_busy(utils: list[float], idle: float, busy: float) -> int:
    """Idle-to-busy switches, passing through intermediate readings (0 -> 24 -> 100 counts once)."""
    state, n = None, 0
    for v in utils:
        if v < idle:
            state = "idle"
        elif v >= busy:
            if state == "idle":
                n += 1
            state = "busy"
    return n


def _input_wait(ctx: RuleContext, gpu: int) -> float | None:
    """Mean input-wait share over the window of the probed ranks on this GPU."""
    frame = ctx.frame
    if frame is None or not frame.ranks:
        return None
    pids = {p.pid for g in frame.gpus if g.index == gpu for p in g.processes}
    vals = [v for subject, r in ctx.ranks() if r.pid in pids or (len(frame.gpus) == 1 and r.cuda)
            for v in ctx.rank_window(subject, "input_wait", ctx.config.starvation_window_s)]
    return sum(vals) / len(vals) if len(vals) >= 3 else None


def _quartiles(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return s[len(s) // 4], s[(3 * len(s)) // 4]


class Starvation:
    id = "starvation"
    title = "Data starvation"
    severity = Severity.WARNING
    raise_after = 8.0
    clear_after = 15.0
    remedies = (
        "Raise DataLoader num_workers (try the number of free CPU cores per GPU).",
        "Set pin_memory=True and persistent_workers=True; raise prefetch_factor.",
        "Move heavy CPU preprocessing out of the step: pre-process offline, or decode/augment on the GPU.",
        "Check the storage: local NVMe or a RAM cache instead of a network filesystem.",
        "Log, print and checkpoint less often inside the training loop.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.starvation_window_s
        for i in ctx.gpu_indices():
            subject = gpu_subject(i)
            pairs = ctx.gpu_pairs(i, "util", w, min_n=8, min_span=0.5)
            if not pairs or ctx.is_holding("pcie", subject):
                continue  # too little history, or the copies to the GPU explain the gaps better than the loader
            active = ctx.is_active(self.id, subject)
            utils = [v for _, v in pairs]
            n = len(utils)
            mu = sum(utils) / n
            idle_frac = sum(1 for v in utils if v < c.starvation_idle_util) / n
            busy_frac = sum(1 for v in utils if v >= c.starvation_busy_util) / n
            transitions = _idle_to_busy(utils, c.starvation_idle_util, c.starvation_busy_util)
            lows, highs = dict(ctx.gpu_pairs(i, "util_min", w)), ctx.gpu_pairs(i, "util_max", w)
            windowed = [(lows[t], hi) for t, hi in highs if t in lows]
            spiky_ticks = sum(1 for lo, hi in windowed
                              if lo < c.starvation_idle_util and hi >= c.starvation_busy_util)
            spiky_tick_frac = spiky_ticks / len(windowed) if windowed else 0.0

            def is_spiky(relax: float) -> bool:
                return (idle_frac >= c.starvation_min_idle_frac * relax and busy_frac >= c.starvation_min_busy_frac
                        and transitions >= 3) or spiky_tick_frac >= 0.3 * relax

            spiky = is_spiky(0.5 if active else 1.0)
            strong_spiky = is_spiky(1.0)

            cpu_note = self._cpu_evidence(ctx)
            wait = _input_wait(ctx, i)
            waits = wait is not None and wait >= c.starvation_input_wait
            low_util_cpu_bound = mu < 60.0 and cpu_note is not None and mu >= 1.0
            if mu > 90.0 and not waits or not (spiky or low_util_cpu_bound or waits):
                continue

            if spiky:
                gaps = _idle_gaps(pairs, c.starvation_idle_util)
                idle_share = max(idle_frac, 0.0)
                if idle_share > 0 and len(gaps) >= 2:
                    lo, hi = _quartiles(gaps)
                    text = (f"GPU {i} idle {idle_share * 100:.0f} % of the last {w:.0f} s "
                            f"in {fmt_range(lo, hi)} gaps (mean utilization {mu:.0f} %)")
                else:
                    text = (f"GPU {i} utilization swings between idle and busy within "
                            f"{spiky_tick_frac * 100:.0f} % of sampling periods over the last {w:.0f} s "
                            f"(mean {mu:.0f} %)")
            else:
                text = f"GPU {i} averages only {mu:.0f} % utilization over the last {w:.0f} s"
            if cpu_note:
                text += f" while {cpu_note}"
            if wait is not None:
                text += f"; the job waits for its next batch {wait * 100:.0f} % of the time (measured in the job)"
            yield Finding(subject, text, strong=strong_spiky or waits or low_util_cpu_bound)

    @staticmethod
    def _cpu_evidence(ctx: RuleContext) -> str | None:
        c = ctx.config
        proc = ctx.process
        if proc is not None and proc.alive:
            workers = proc.loader_workers
            hot = [wk for wk in workers if (wk.cpu_percent or 0) >= c.starvation_busy_worker_cpu]
            if workers and len(hot) >= max(1, len(workers) // 2):
                cpu = mean([wk.cpu_percent or 0 for wk in hot])
                return f"{len(hot)} of {len(workers)} loader workers sit at {cpu:.0f} % CPU"
        w = c.starvation_window_s
        iowait = ctx.host_window("iowait", w)
        if iowait and (m := sum(iowait) / len(iowait)) >= 20:
            return f"the host waits on I/O {m:.0f} % of the time"
        cpu = ctx.host_window("cpu_percent", w)
        if cpu and (m := sum(cpu) / len(cpu)) >= 90:
            return f"host CPU is at {m:.0f} %"
        return None
