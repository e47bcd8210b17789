"""Out of memory: the caching allocator could not get memory (the probe's ``num_ooms``), or had to
free its whole cache and try again (``num_alloc_retries``: every retry synchronises the device and
returns cached blocks to the driver, a slow step).

Both are counters in ``torch.cuda.memory_stats()``: the finding holds while either rose within the
last WINDOW_S seconds, so a caught ``OutOfMemoryError`` that the job survived is still said."""

from __future__ import annotations

from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.units import fmt_bytes

WINDOW_S = 120.0


def _rise(pairs: list[tuple[float, float]]) -> tuple[int, float | None]:
    """How much a counter rose over the pairs, and when it last did."""
    if len(pairs) < 2:
        return 0, None
    last = next((t for (t, v), (_, u) in zip(reversed(pairs), reversed(pairs[:-1])) if v > u), None)
    return int(pairs[-1][1] - pairs[0][1]), last


class OutOfMemory(HostRule):
    id = "oom"
    title = "Out of GPU memory"
    severity = Severity.WARNING  # critical once an allocation has failed
    raise_after = 0.0
    clear_after = 5.0
    now_s = None  # an event: it happened, within the window
    remedies = (
        "A smaller batch, with gradient accumulation to keep the effective batch size.",
        "Mixed precision (torch.autocast with bfloat16) halves the activations.",
        "Activation checkpointing (torch.utils.checkpoint) trades compute for memory; so do shorter sequences.",
        "A lighter optimizer state (fused/8-bit Adam, or SGD with momentum) if the model is large.",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when much of the cache sits in split blocks.",
        "Check the GPU for other processes' memory (nvidia-smi), and any set_per_process_memory_fraction cap.",
    )

    def evaluate(self, ctx: RuleContext):
        for subject, r in ctx.ranks():
            if not r.cuda:
                continue
            ooms, oom_at = _rise(ctx.rank_pairs(subject, "ooms", WINDOW_S))
            retries, retry_at = _rise(ctx.rank_pairs(subject, "alloc_retries", WINDOW_S))
            if ooms <= 0 and retries <= 0:
                continue
            parts = []
            if ooms > 0:
                parts.append(f"{ooms} allocation{'s' if ooms > 1 else ''} failed (out of memory)")
            if retries > 0:
                parts.append(f"{retries} allocation retr{'y' if retries == 1 else 'ies'} (the cache freed to make room)")
            last = max(t for t in (oom_at, retry_at) if t is not None)
            text = f"{r.label}: {' and '.join(parts)}, the last {ctx.now - last:.0f} s ago"
            if r.reserved is not None:
                text += f"; it reserves {fmt_bytes(r.reserved)}"
                if r.peak:
                    text += f", peaks at {fmt_bytes(r.peak)} allocated"
                if r.inactive_split and r.inactive_split >= 0.2 * r.reserved:
                    text += f", {fmt_bytes(r.inactive_split)} of the cache in split blocks (fragmentation)"
            yield Verdict(subject, text, Severity.CRITICAL if ooms > 0 else Severity.WARNING)
