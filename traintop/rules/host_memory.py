"""Host RAM or swap pressure: the input pipeline and the job itself slow down or get killed."""

from __future__ import annotations

from traintop.rules.declaration import HostRule
from traintop.rules.engine import REVERSED, Verdict, RuleContext, Severity
from traintop.units import GiB, fmt_bytes


class HostMemoryPressure(HostRule):
    id = "host_memory"
    title = "Host memory pressure"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 30.0
    now_s = None  # RAM now; swap growth needs its minute
    FREED_MARGIN = 0.05  # RAM this far below the threshold, and no swapping: the pressure is gone
    remedies = (
        "Fewer DataLoader workers or a smaller prefetch_factor: each worker holds its own copy of what it loads.",
        "Load the dataset lazily (memory-map it) instead of into RAM in every process.",
        "Stop other memory-hungry processes on the host; add swap only as a last resort (it is slow).",
    )

    def evaluate(self, ctx: RuleContext):
        h = ctx.host
        if h is None or not h.mem_total:
            return
        frac = h.mem_used / h.mem_total if h.mem_used is not None else 0.0
        swap = ctx.host_window("swap_used", 60.0)
        swap_rise = swap[-1] - swap[0] if len(swap) >= 2 else 0.0
        if frac >= ctx.config.host_mem_frac:
            yield Verdict("host", f"host RAM {frac * 100:.0f} % used ({fmt_bytes(h.mem_used)} of {fmt_bytes(h.mem_total)})",
                          Severity.CRITICAL if frac >= 0.98 else None)
        elif swap_rise >= ctx.config.host_swap_rise_gib * GiB:
            yield Verdict("host", f"the host swapped out {fmt_bytes(swap_rise)} in the last minute "
                                  f"(RAM {frac * 100:.0f} % used)")
        elif frac < ctx.config.host_mem_frac - self.FREED_MARGIN and swap_rise <= 0 and ctx.is_active(self.id, "host"):
            # freed (the process that held it ended, the dataset unloaded): the alert ends now, not 30 s on
            yield Verdict("host", f"host RAM {frac * 100:.0f} % used now ({fmt_bytes(h.mem_used)} of "
                                  f"{fmt_bytes(h.mem_total)}): freed", state=REVERSED)
