"""Step-time regression: the job's steps became markedly slower than they were."""

from __future__ import annotations

import bisect
import math
from operator import itemgetter

from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.stats import median

_value = itemgetter(1)


class StepTimeRegression(HostRule):
    id = "step_regression"
    title = "Steps slowed down"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 30.0
    now_s = None  # it compares the last window with the minutes before: cut to now, nothing is before
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
            if len(pairs) - split < 5 or split < 10:
                continue
            if max(pairs[split:], key=_value)[1] < c.step_regression_ratio * min(pairs[:split], key=_value)[1]:
                continue  # even the slowest recent step is not that much slower than the fastest before
            now = median([v for _, v in pairs[split:]])
            base = median([v for _, v in pairs[:split]])
            if base <= 0 or now / base < c.step_regression_ratio:
                continue
            yield Verdict(subject,
                          f"{r.label}'s steps take {now * 1000:.0f} ms over the last {w:.0f} s, "
                          f"{now / base:.1f}× the {base * 1000:.0f} ms before")
