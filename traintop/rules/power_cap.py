"""Power cap at full load: normal for a busy GPU, shown as information so nobody chases it."""

from __future__ import annotations

from traintop.rules.engine import Finding, RuleContext, Severity
from traintop.samples import REASON_SW_POWER_CAP
from traintop.store import present


class PowerCapAtFullLoad:
    id = "power_cap"
    title = "Power-capped at full load (normal)"
    severity = Severity.INFO
    raise_after = 10.0
    clear_after = 30.0
    remedies = ("Nothing to fix: a fully loaded GPU runs at its power limit and the driver trims clocks to hold it.",)

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.power_cap_window_s
        store = ctx.store
        for g in ctx.gpus():
            i = g.index
            reasons = [int(r) for r in present(store.window(f"gpu{i}.reasons", w))]
            util = present(store.window(f"gpu{i}.util", w))
            power = present(store.window(f"gpu{i}.power", w))
            if len(reasons) < 4 or not util:
                continue
            cap_frac = sum(1 for r in reasons if r & REASON_SW_POWER_CAP) / len(reasons)
            u_mean = sum(util) / len(util)
            if cap_frac < 0.5 or u_mean < c.power_cap_min_util:
                continue
            text = f"GPU {i} at {u_mean:.0f} % utilization with the power cap active {cap_frac * 100:.0f} % of the last {w:.0f} s"
            if power and g.power_limit_w:
                text += f" ({sum(power) / len(power):.0f} W of {g.power_limit_w:.0f} W)"
            held = present(store.window(f"gpu{i}.throttle_power", w))
            if held:
                text += f"; clocks held down by the power limit {sum(held) / len(held):.0f} % of the time"
            yield Finding(f"gpu{i}", text)
