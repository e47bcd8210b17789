"""Optimizer steps skipped: a GradScaler throws away step after step because its gradients hold inf
or NaN (fp16 overflow). The GPU stays busy and the loop goes on, so no other rule sees it: the
model simply stops learning. Needs the probe (it counts the steps the scaler skipped)."""

from __future__ import annotations

from traintop.rules.declaration import HostRule
from traintop.rules.engine import RuleContext, Severity, Verdict


def _rise(pairs: list[tuple[float, float]]) -> float:
    return pairs[-1][1] - pairs[0][1] if len(pairs) >= 2 else 0.0


class SkippedSteps(HostRule):
    id = "skipped_steps"
    title = "Optimizer steps skipped (fp16 overflow)"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 15.0
    now_s = 10.0  # the share must hold over the last seconds too: it ends once steps are taken again
    remedies = (
        "Find where the first inf or NaN appears: check the loss and the inputs with torch.isfinite before "
        "backward, or run a few steps under torch.autograd.set_detect_anomaly(True).",
        "Train in bf16 instead of fp16 (Ampere or newer): its range is fp32's, so it needs no loss scaling "
        "and cannot overflow this way.",
        "Lower the learning rate or clip gradients (after scaler.unscale_(optimizer)); log scaler.get_scale(): "
        "a scale that keeps halving towards 0 means every step overflows and the run needs a restart from "
        "the last good checkpoint.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.skipped_steps_window_s
        for subject, r in ctx.ranks():
            skipped = ctx.rank_pairs(subject, "skipped_steps", w, min_n=3)
            steps = ctx.rank_pairs(subject, "steps", w, min_n=3)
            if not skipped or not steps:
                continue  # no GradScaler seen in this rank (or too few readings)
            n_skipped, n_steps = _rise(skipped), _rise(steps)
            if n_steps <= 0 or n_skipped < c.skipped_steps_min_n or n_skipped / n_steps < c.skipped_steps_min_frac:
                continue
            span = steps[-1][0] - steps[0][0]
            every = n_skipped >= n_steps
            how_many = "every one" if every else f"{n_skipped:.0f}"
            outcome = "the weights are not being updated" if every else "those steps updated nothing"
            yield Verdict(subject,
                          f"{r.label}: the GradScaler skipped {how_many} of its last {n_steps:.0f} optimizer steps "
                          f"(inf or NaN gradients) over {span:.0f} s: {outcome}",
                          severity=Severity.CRITICAL if every else None)
