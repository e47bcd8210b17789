"""Creeping memory: used GPU memory rising steadily, with a forecast of when it is full."""

from __future__ import annotations

from operator import itemgetter

from traintop.metrics import gpu_key, gpu_subject, rank_key
from traintop.rules.declaration import HostRule
from traintop.rules.engine import LAPSED, REVERSED, Verdict, RuleContext, Severity
from traintop.store import linear_fit
from traintop.units import GiB, MiB, fmt_bytes, fmt_duration

_value = itemgetter(1)
SLOW_LEAK_WINDOWS = (2.5, 5.0)  # times creep_window_s: the longer windows a slow leak needs
STARTUP_MAX_S = 120.0  # a rise with no pause for this long after a job's memory appeared is no start-up any more
PLATEAU_S = 5.0  # memory that holds this still has finished its start-up ramp
SETTLED_MIN_S = 10.0  # a rate is measured over this much after the start-up at least


class MemoryCreep(HostRule):
    id = "memory_creep"
    title = "Creeping GPU memory"
    severity = Severity.WARNING
    raise_after = 5.0  # the window already asks for a steady rise; and it must hold now
    clear_after = 60.0
    now_s = 20.0  # a slope needs a few seconds more than a mean
    remedies = (
        "Look for tensors kept across steps: losses or outputs appended to lists without .item() or .detach().",
        "Check for graphs retained by accident (retain_graph=True, tensors stored with their history).",
        "Take a memory snapshot (torch.cuda.memory._record_memory_history) to see who allocates.",
        "If it is growth you need: smaller batch, bf16/fp16, gradient accumulation, activation checkpointing.",
        "Check for other processes on the GPU; a high reserved figure alone is the caching allocator, not a leak.",
    )

    def evaluate(self, ctx: RuleContext):
        for g in ctx.gpus():
            found = self._fit(ctx, g)
            if found is None and ctx.is_active(self.id, gpu_subject(g.index)):
                found = self._since(ctx, g)
            if found is not None:
                yield found

    def _since(self, ctx: RuleContext, g) -> Verdict | None:
        """For a raised alert no longer seen: memory fell well below its peak (freed: the condition
        reversed, the alert ends now), or it stopped rising (noise or a pause: the usual delay)."""
        key, what = self._series(ctx, g)
        pairs = ctx.pairs(key, ctx.config.creep_window_s)
        if len(pairs) < 2:
            return None
        peak = max(v for _, v in pairs)
        now = pairs[-1][1]
        i = g.index
        if peak - now >= max(512 * MiB, 0.2 * peak):
            return Verdict(gpu_subject(i), f"GPU {i} {what} fell from {fmt_bytes(peak, 'GiB')} to "
                                           f"{fmt_bytes(now, 'GiB')}: the memory was freed", state=REVERSED)
        if not ctx.pairs(key, self._windows(ctx)[0], min_n=10, min_span=0.8):
            # Too little history to measure a rate (a replay of a recording begun mid-creep, a
            # seek): not a sign it stopped; the last measured rate stands until one can be measured.
            return None
        span = pairs[-1][0] - pairs[0][0]
        # still at its highest: it may rise, only no longer steadily enough to be a creep
        how = "no longer rising steadily" if now >= peak and now > pairs[0][1] else "no longer rising"
        return Verdict(gpu_subject(i), f"GPU {i} {what} {how}: {fmt_bytes(now, 'GiB')} now, "
                                       f"peak {fmt_bytes(peak, 'GiB')} over the last {span:.0f} s", state=LAPSED)

    @staticmethod
    def _windows(ctx: RuleContext) -> list[float]:
        """The fit's windows, shortest first: 30 s, half the window, the window, and 2.5 and 5 times it
        (a slow leak, 16 MiB/s, rises less than 2 % of an H200 in two minutes, yet fills it in hours)."""
        w = ctx.config.creep_window_s
        return sorted({min(30.0, w), w / 2, w} | {k * w for k in SLOW_LEAK_WINDOWS})

    @staticmethod
    def _series(ctx: RuleContext, g) -> tuple[str, str]:
        """The probe's allocated bytes for a rank on this GPU (ground truth), else NVML's used."""
        pids = {p.pid for p in g.processes}
        for subject, r in ctx.ranks():
            if r.pid in pids and r.allocated is not None:
                return rank_key(subject, "allocated"), f"{r.label}'s allocated memory"
        return gpu_key(g.index, "mem_used"), "memory"

    @staticmethod
    def _startup_end(ctx: RuleContext, key: str, g, total: int) -> float | None:
        """When the job on this GPU finished starting up: the probe's rank after its second optimizer
        step (the first makes the optimizer's state); else its memory rose from the idle level and then
        held still for PLATEAU_S. ``ctx.now`` while it is still starting up; None where no start-up is
        in view (memory already up when the history begins)."""
        span = STARTUP_MAX_S + ctx.config.creep_window_s
        if key.startswith("rank"):
            steps = ctx.pairs(key.rsplit(".", 1)[0] + ".steps", span)
            if not steps or steps[0][1] >= 2:
                return None
            return next((t for t, n in steps if n >= 2), ctx.now)
        pairs = ctx.pairs(key, span)
        low = max(1536 * MiB, 0.03 * total)
        last_low = max((k for k, (_, v) in enumerate(pairs) if v < low), default=None)
        if last_low is None:
            return None
        after = pairs[last_low:]
        tol = max(64 * MiB, 0.005 * total)
        j = 0
        for i in range(len(after)):
            # the shortest stretch ending at i that lasts PLATEAU_S
            while j + 1 < i and after[i][0] - after[j + 1][0] >= PLATEAU_S:
                j += 1
            if after[i][0] - after[j][0] >= PLATEAU_S:
                window = [v for _, v in after[j:i + 1]]
                if max(window) - min(window) < tol:
                    return after[j][0]
        start = after[0][0]
        return ctx.now if ctx.now - start < STARTUP_MAX_S else start + STARTUP_MAX_S

    def _fit(self, ctx: RuleContext, g):
        """The shortest recent window (30 s, half the window, the window) with a steady rise:
        the most recent rate is the one that predicts when memory runs out."""
        c = ctx.config
        i = g.index
        key, what = self._series(ctx, g)
        total = g.mem_total or 0
        recent = getattr(ctx, "recent_s", None)
        if recent is None:
            min_rise = max(512 * MiB, c.creep_min_rise_frac * total)
        else:
            # asked whether it still rises now (the last seconds alone): at the creep's rate, not by the
            # 2 % of the card a window of minutes must show (a slow leak adds a few hundred MiB in them)
            min_rise = 0.5 * c.creep_min_rate_mib_s * MiB * recent
        windows = self._windows(ctx)
        # The windows all end now, so none rises more than the longest: where that one holds
        # enough history and rises too little (most of the time), no shorter one need be read
        widest = ctx.pairs(key, windows[-1], min_n=10, min_span=0.8)
        if widest and widest[-1][1] - min(map(_value, widest)) < min_rise:
            return None
        # a job loading its weights, making its optimizer state and first activations is no leak
        settled = self._startup_end(ctx, key, g, total)
        for w in windows:
            pairs = widest if w == windows[-1] else ctx.pairs(key, w, min_n=10, min_span=0.8)
            if pairs and settled is not None and pairs[0][0] < settled:
                # only what came after the start-up ramp, if enough of it to measure a rate
                pairs = [p for p in pairs if p[0] >= settled]
                if len(pairs) < 10 or pairs[-1][0] - pairs[0][0] < SETTLED_MIN_S:
                    continue
            if not pairs:
                continue
            pairs = _floor(pairs, w if recent is None else min(w, recent))
            if len(pairs) < 3:
                continue
            rise = pairs[-1][1] - min(map(_value, pairs))
            if rise < min_rise:  # no fit needed to rule it out
                continue
            fit = linear_fit(pairs)
            if fit is None:
                continue
            slope, _, r2 = fit
            if slope < c.creep_min_rate_mib_s * MiB or r2 < c.creep_min_r2:
                continue
            span = pairs[-1][0] - pairs[0][0]
            used = pairs[-1][1]
            rate = f"{slope / GiB:.2f} GiB/s" if slope >= 0.1 * GiB else f"{slope / MiB:.0f} MiB/s"
            text = (f"GPU {i} {what} rising {rate} over the last {span:.0f} s "
                    f"({fmt_bytes(pairs[0][1], 'GiB')} → {fmt_bytes(used, 'GiB')}"
                    + (f" of {fmt_bytes(total, 'GiB')})" if total else ")"))
            sev = None
            if total and total > used:
                tto = (total - used) / slope
                text += f"; at this rate it is full in {fmt_duration(tto)}"
                if tto <= c.creep_critical_tto_s:
                    sev = Severity.CRITICAL
            return Verdict(gpu_subject(i), text, sev)
        return None


FLOOR_BUCKETS = 60  # a window's floor is read in this many buckets (1 s each at least)


def _floor(pairs: list, window: float) -> list:
    """The lowest reading of each bucket of the window: a leak raises the floor that memory returns to
    between steps; the peaks inside a step (activations, 1-6 GiB of swing) are no trend."""
    width = max(1.0, window / FLOOR_BUCKETS)
    end = pairs[-1][0]
    out: list = []
    key = None
    for t, v in pairs:
        k = int((end - t) // width)
        if k != key:
            out.append((t, v))
            key = k
        elif v < out[-1][1]:
            out[-1] = (out[-1][0], v)
    return out
