"""Step-time regression: the job's steps became markedly slower than they were, and are slow now."""

from __future__ import annotations

from traintop.rules.declaration import HostRule
from traintop.rules.engine import REVERSED, Verdict, RuleContext, Severity
from traintop.stats import median

NOW_S = 5.0  # the steps now: their median over the last seconds ...
NOW_MIN_N = 3  # ... of at least this many readings
PAUSE_MIN_S = 2.0  # a gap between steps this long at least ...
PAUSE_FACTOR = 4.0  # ... and this many times the usual gap is a pause, not a slow step


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
            gaps = _gaps(ctx.rank_pairs(subject, "steps", w * 11, min_n=12))
            if len(gaps) < 15:
                continue
            end = gaps[-1][0]
            cut = max(PAUSE_MIN_S, PAUSE_FACTOR * median([dt for _, dt, _ in gaps]))
            paces = _paces(gaps, cut)
            base = _median_pace([p for t, p in paces if t <= end - w], 10)
            window = _median_pace([p for t, p in paces if t > end - w], 5)
            now = _median_pace([p for t, p in paces if t > end - NOW_S], NOW_MIN_N)
            if base is None or window is None or now is None or base <= 0:
                continue
            if window / base >= c.step_regression_ratio and now / base >= c.step_regression_ratio:
                yield Verdict(subject,
                              f"{r.label}'s steps take {now * 1000:.0f} ms now (the last {NOW_S:.0f} s), "
                              f"{now / base:.1f}× the {base * 1000:.0f} ms before; {window * 1000:.0f} ms over the "
                              f"last {w:.0f} s")
            elif ctx.is_active(self.id, subject) and now / base < c.step_regression_ratio:
                yield Verdict(subject, f"{r.label}'s steps are back to {now * 1000:.0f} ms (the {base * 1000:.0f} ms "
                                       "before)", state=REVERSED)


def _gaps(pairs: list) -> list[tuple[float, float, float]]:
    """(when, seconds, steps) between the readings at which the step count rose: the job's pace as its
    step counter tells it, whether or not it synchronises every step (a step's own time, taken on the
    CPU, is the launch time of an asynchronous loop)."""
    out: list[tuple[float, float, float]] = []
    if not pairs:
        return out
    t0, s0 = pairs[0]
    for t, n in pairs[1:]:
        if n > s0:
            out.append((t, t - t0, n - s0))
            t0, s0 = t, n
        elif n < s0:  # a restart: counting begins again
            t0, s0 = t, n
    return out


def _paces(gaps: list, cut: float) -> list[tuple[float, float]]:
    """(second, seconds a step) for each second in which steps ended: the pace of each second, the
    pauses (a gap longer than ``cut``: a checkpoint, an evaluation) left out, since they are the pause
    finding's, not slower steps. A median of these moves with the pace of most seconds, not with
    the tail of a phase that has just ended."""
    out: list[tuple[float, float]] = []
    second, dts, steps = -1, 0.0, 0.0
    for t, dt, n in gaps:
        if dt > cut:
            continue
        k = int(t)
        if k != second:
            if steps:
                out.append((float(second), dts / steps))
            second, dts, steps = k, 0.0, 0.0
        dts += dt
        steps += n
    if steps:
        out.append((float(second), dts / steps))
    return out


def _median_pace(paces: list[float], min_n: int) -> float | None:
    return median(paces) if len(paces) >= min_n else None
