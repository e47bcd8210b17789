"""Imbalance between GPUs of one job: one lags, all wait for it at every all-reduce."""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.collective import job_gpus
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity


JOB_WAITS = ("straggler", "stall")  # on any of the job's GPUs: the job waits, no GPU lags
LAGGING_CAUSES = ("starvation", "pcie", "underuse", "thermal")  # on the lagging GPU: why it lags


class Imbalance(HostRule):
    id = "imbalance"
    title = "GPUs busy unequally"
    severity = Severity.WARNING
    defers_to = JOB_WAITS + LAGGING_CAUSES
    raise_after = 20.0
    clear_after = 30.0
    now_s = 10.0  # it counts ten samples or more
    remedies = (
        "Check the lagging GPU for throttling (clock-event reasons, temperature) and for other processes.",
        "Uneven batches (variable sequence lengths) make ranks wait for the slowest: bucket by length.",
        "Check each rank's data pipeline: one starved rank holds back every all-reduce.",
    )

    def evaluate(self, ctx: RuleContext):
        if any(ctx.is_holding(r, gpu_subject(g.index)) for g in ctx.gpus() for r in JOB_WAITS):
            return
        # Only the watched job's GPUs: on a shared node another job's GPU is not "lagging".
        job = set(job_gpus(ctx)) if ctx.process is not None else None
        gpus = [g for g in ctx.gpus() if g.processes and (job is None or g.index in job)]
        if len(gpus) < 2:
            return
        means = {}
        for g in gpus:
            u = ctx.gpu_window(g.index, "util", ctx.config.imbalance_window_s)
            if len(u) >= 10:
                means[g.index] = sum(u) / len(u)
        if len(means) < 2:
            return
        hi = max(means, key=means.__getitem__)
        lo = min(means, key=means.__getitem__)
        lagging = gpu_subject(lo)
        if any(ctx.is_holding(r, lagging) or ctx.is_active(r, lagging) for r in LAGGING_CAUSES):
            return  # the lagging GPU's own finding says why it lags: "busy unequally" adds nothing
        if means[hi] >= 50 and means[hi] - means[lo] >= ctx.config.imbalance_gap:
            yield Verdict("gpus", f"GPU {lo} averages {means[lo]:.0f} % utilization over the last {ctx.config.imbalance_window_s:.0f} s while "
                                  f"GPU {hi} averages {means[hi]:.0f} %")
