"""Clocks below maximum for no reason: busy, yet the SM clock is low and no clock-event reason explains it."""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.samples import REASON_GPU_IDLE


class ClocksBelowMax(HostRule):
    id = "low_clocks"
    title = "Clocks below maximum"
    severity = Severity.WARNING
    raise_after = 15.0
    clear_after = 30.0
    now_s = 10.0  # it counts ten samples or more
    remedies = (
        "Check for application clocks or a clock lock set by an administrator (nvidia-smi -q -d CLOCK).",
        "Check the GPU's power and performance state (nvidia-smi -q -d PERFORMANCE); a low P-state under load is a fault.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        for g in ctx.gpus():
            i = g.index
            if not g.sm_clock_max:
                continue
            util = ctx.gpu_window(i, "util", 20.0)
            clocks = ctx.gpu_window(i, "sm_clock", 20.0)
            reasons = ctx.gpu_reasons(i, 20.0)
            if len(util) < 8 or len(clocks) < 8 or not reasons:
                continue
            if sum(util) / len(util) < c.low_clocks_min_util or any(r & ~REASON_GPU_IDLE for r in reasons):
                continue  # not busy, or a reason (power cap, thermal, app clocks...) explains it
            mean_clock = sum(clocks) / len(clocks)
            if mean_clock < c.low_clocks_frac * g.sm_clock_max:
                yield Verdict(gpu_subject(i), f"GPU {i} busy at {sum(util) / len(util):.0f} % with its SM clock at "
                                         f"{mean_clock:.0f} of {g.sm_clock_max} MHz and no clock-event reason")
