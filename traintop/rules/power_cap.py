"""Power cap at full load: normal for a busy GPU, shown as information so nobody chases it."""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.collective import collective_waits
from traintop.rules.declaration import HostRule
from traintop.rules.engine import LAPSED, REVERSED, Verdict, RuleContext, Severity
from traintop.samples import REASON_SW_POWER_CAP

RECENT_S = 5.0  # a load gone for this long is a change of phase, not noise
SPIN_SM_PCT = 20.0  # "utilization" near 100 % with SMs this idle is a kernel spinning (a hang), not load
CAP_POWER_FRAC = 0.4  # a GPU held by its power cap draws near its limit; below 40 % of it, the cap holds nothing


class PowerCapAtFullLoad(HostRule):
    id = "power_cap"
    title = "Power-capped at full load (normal)"
    severity = Severity.INFO
    defers_to = ("stall",)
    raise_after = 10.0
    clear_after = 30.0
    remedies = ("Nothing to fix: a fully loaded GPU runs at its power limit and the driver trims clocks to hold it.",)

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.power_cap_window_s
        waits = collective_waits(ctx, c.straggler_window_s)
        for g in ctx.gpus():
            i, subject = g.index, gpu_subject(g.index)
            if (waits is not None and i in waits.waiting) or any(ctx.is_holding(r, subject) for r in self.defers_to):
                # "utilization" is a kernel spinning in a collective, not load
                if ctx.is_active(self.id, subject):
                    yield Verdict(subject, f"GPU {i} is waiting, not loaded", state=REVERSED)
                continue
            reasons = ctx.gpu_reasons(i, w)
            u_mean = ctx.gpu_mean(i, "util", w)
            if len(reasons) < 4 or u_mean is None:
                continue
            cap_frac = sum(1 for r in reasons if r & REASON_SW_POWER_CAP) / len(reasons)
            window_holds = cap_frac >= 0.5 and u_mean >= c.power_cap_min_util
            if not window_holds and not ctx.is_active(self.id, subject):
                continue
            unloaded = self._unloaded_now(ctx, g)  # only where it can matter: three more windows
            holds = window_holds and unloaded is None
            if not holds and not ctx.is_active(self.id, subject):
                continue
            text = f"GPU {i} at {u_mean:.0f} % utilization with the power cap active {cap_frac * 100:.0f} % of the last {w:.0f} s"
            power = ctx.gpu_mean(i, "power_w", w)
            if power is not None and g.power_limit_w:
                text += f" ({power:.0f} W of {g.power_limit_w:.0f} W)"
            held = ctx.gpu_mean(i, "throttle_power", w)
            if held is not None:
                text += f"; clocks held down by the power limit {held:.0f} % of the time"
            if holds:
                yield Verdict(subject, text)
                continue
            if unloaded is not None:  # the load is gone: not a fully loaded GPU any more
                yield Verdict(subject, f"{text}; now {unloaded}", state=REVERSED)
                continue
            yield Verdict(subject, text, state=LAPSED)

    @staticmethod
    def _unloaded_now(ctx: RuleContext, g) -> str | None:
        """Why the GPU is plainly not at full load over the last few seconds (a data-starved
        or idle phase, a kernel spinning in a hang, power far below the limit), else None."""
        c, i = ctx.config, g.index
        recent = ctx.gpu_mean(i, "util", RECENT_S)
        if recent is not None and recent < c.power_cap_min_util - 25:
            return f"{recent:.0f} % utilization"
        sm = ctx.gpu_mean(i, "sm_active", RECENT_S)
        if sm is not None and sm < SPIN_SM_PCT:
            return f"SMs active {sm:.0f} % of the time: a kernel waits, nothing computes"
        power = ctx.gpu_mean(i, "power_w", RECENT_S)
        if power is not None and g.power_limit_w and power < CAP_POWER_FRAC * g.power_limit_w:
            return f"{power:.0f} W of {g.power_limit_w:.0f} W"
        return None
