"""Step-time regression: the job's steps became markedly slower than they were, and are slow now."""

from __future__ import annotations

import bisect
import math
from operator import itemgetter

from traintop.rules.declaration import HostRule
from traintop.rules.engine import REVERSED, Verdict, RuleContext, Severity
from traintop.stats import median

_value = itemgetter(1)
NOW_S = 5.0  # the steps now: their median over the last seconds ...
NOW_MIN_N = 3  # ... of at least this many readings


class StepTimeRegression(HostRule):
    id = "step_regression"
    title = "Steps slowed down"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 30.0
    # It compares the last window with the minutes before (cut to now, nothing is before), and asks
    # the last NOW_S seconds itself: slower now to start, back to the old pace to end at once.
    now_s = None
    remedies = (
        "Look at what changed at that moment: throttling (clock-event reasons), another process on the GPU, "
        "a data-loading phase, evaluation or checkpointing inside the loop.",
        "Compare GPU utilization before and after: lower means the step now waits for something else.",
        "With several GPUs, one slow rank holds back every all-reduce: check each GPU.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.step_regression_window_s
        for subject, r in ctx.ranks():
            pairs = ctx.rank_pairs(subject, "step_time", w * 11, min_n=12)
            if not pairs:
                continue
            split = bisect.bisect_right(pairs, (pairs[-1][0] - w, math.inf))  # the last w seconds from here on
            recent = [v for t, v in pairs[split:] if t > pairs[-1][0] - NOW_S]
            if len(pairs) - split < 5 or split < 10 or len(recent) < NOW_MIN_N:
                continue
            base = median([v for _, v in pairs[:split]])
            if base <= 0:
                continue
            now = median(recent)
            window = median([v for _, v in pairs[split:]])
            slow = (max(pairs[split:], key=_value)[1] >= c.step_regression_ratio * min(pairs[:split], key=_value)[1]
                    and window / base >= c.step_regression_ratio and now / base >= c.step_regression_ratio)
            if slow:
                yield Verdict(subject,
                              f"{r.label}'s steps take {now * 1000:.0f} ms now (the last {NOW_S:.0f} s), "
                              f"{now / base:.1f}× the {base * 1000:.0f} ms before; {window * 1000:.0f} ms over the "
                              f"last {w:.0f} s")
            elif ctx.is_active(self.id, subject) and now / base < c.step_regression_ratio:
                yield Verdict(subject, f"{r.label}'s steps are back to {now * 1000:.0f} ms (the {base * 1000:.0f} ms "
                                       "before)", state=REVERSED)
