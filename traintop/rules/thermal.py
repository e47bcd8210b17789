"""Thermal throttling: the clock-event reasons say so, or the GPU sits at its slowdown temperature."""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.samples import POWER_BRAKE_REASONS, THERMAL_REASONS, reason_names


class ThermalThrottle(HostRule):
    id = "thermal"
    title = "Thermal throttling"
    severity = Severity.WARNING
    raise_after = 5.0
    clear_after = 30.0
    remedies = (
        "Check cooling: fans, airflow, blocked intakes, dust, the room or rack inlet temperature.",
        "Check neighbouring GPUs and hot spots in the chassis (nvidia-smi -q -d TEMPERATURE,PERFORMANCE).",
        "A HW power brake means an external power problem (PSU, cabling): tell the operator.",
        "Until fixed, expect slower steps; a lower power limit set by an administrator trades speed for heat.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.thermal_window_s
        for g in ctx.gpus():
            i = g.index
            reasons = ctx.gpu_reasons(i, w)
            temps = ctx.gpu_window(i, "temp_c", w)
            slowdown = g.temp_slowdown_c
            n = max(len(reasons), 1)
            thermal_frac = sum(1 for r in reasons if r & THERMAL_REASONS) / n
            brake_frac = sum(1 for r in reasons if r & POWER_BRAKE_REASONS) / n
            hot_frac = 0.0
            if temps and slowdown:
                hot_frac = sum(1 for t in temps if t >= slowdown - c.thermal_margin_c) / len(temps)
            counted = ctx.gpu_window(i, "throttle_thermal", w)  # NVML's thermal violation time
            counted_frac = sum(counted) / len(counted) / 100.0 if counted else 0.0
            frac = max(thermal_frac, hot_frac, brake_frac, counted_frac)
            if len(reasons) + len(temps) + len(counted) < 4 or frac < c.thermal_min_frac:
                continue
            seen = 0
            for r in reasons:
                seen |= r & (THERMAL_REASONS | POWER_BRAKE_REASONS)
            names = ", ".join(reason_names(seen)) or (
                "thermal violation counter" if counted_frac >= hot_frac else "temperature at the slowdown threshold")
            parts = [f"GPU {i} throttled {frac * 100:.0f} % of the last {w:.0f} s ({names})"]
            if temps:
                t_now = temps[-1]
                parts.append(f"{t_now:.0f} °C" + (f" vs slowdown at {slowdown:.0f} °C" if slowdown else ""))
            else:  # said, not left out: a thermal finding without a temperature reads as a mistake
                parts.append("no temperature in this source")
            if g.sm_clock and g.sm_clock_max:
                parts.append(f"SM clock {g.sm_clock} of {g.sm_clock_max} MHz")
            sev = Severity.CRITICAL if brake_frac >= c.thermal_min_frac else None
            yield Verdict(gpu_subject(i), "; ".join(parts), sev)
