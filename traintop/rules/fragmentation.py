"""Fragmentation: the caching allocator holds far more than is allocated and still retries.

Allocated memory is judged at its peak over the window, not at one sample: the probe often
reads it between steps, when the activations are freed (a healthy conv job reads 70 MiB
allocated of 20 GiB reserved there, and 19 GiB inside a step)."""

from __future__ import annotations

from traintop.rules.engine import Finding, RuleContext, Severity
from traintop.units import GiB, fmt_bytes


WINDOW_S = 60.0


class Fragmentation:
    id = "fragmentation"
    title = "Allocator fragmentation"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 60.0
    remedies = (
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before starting the job.",
        "Keep tensor shapes steady between steps (pad variable-length batches to a few bucket sizes).",
        "Avoid torch.cuda.empty_cache() in the loop: it makes the allocator start over, not fragment less.",
        "If allocations still fail: a smaller batch, or activation checkpointing.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        gpus = {g.index: g for g in ctx.gpus()}
        for subject, r in ctx.ranks():
            if not r.cuda or not r.reserved or r.allocated is None:
                continue
            retries = ctx.rank_window(subject, "alloc_retries", WINDOW_S)
            peak = max(ctx.rank_window(subject, "allocated", WINDOW_S) + [r.allocated])
            rising = len(retries) >= 2 and retries[-1] > retries[0]
            unused = max(0, r.reserved - peak)
            frac = unused / r.reserved
            split = r.inactive_split or 0
            big = unused >= c.frag_min_unused_gib * GiB and frac >= c.frag_min_unused_frac
            if not big:
                continue
            split_frac = split / r.reserved
            fragmented = split >= c.frag_min_unused_gib * GiB and split_frac >= c.frag_min_unused_frac
            if not (rising or r.ooms or fragmented):
                continue  # memory cached for reuse, in whole blocks: not fragmentation
            text = (f"{r.label} reserves {fmt_bytes(r.reserved)} but had at most {fmt_bytes(peak)} allocated "
                    f"over the last {WINDOW_S:.0f} s ({frac * 100:.0f} % held unused")
            text += f"; {fmt_bytes(split)} of it in split blocks)" if split else ")"
            g = gpus.get(r.device) if r.device is not None else (next(iter(gpus.values())) if len(gpus) == 1 else None)
            tight = bool(g and g.mem_used is not None and g.mem_total and g.mem_used >= 0.9 * g.mem_total)
            if r.ooms:
                text += f"; {r.ooms} out-of-memory error(s)"
                severity = Severity.CRITICAL
            elif rising or tight:
                text += (f"; {r.alloc_retries} allocation retr{'y' if r.alloc_retries == 1 else 'ies'}"
                         if rising else "; the GPU's memory is nearly full, so the next large allocation may fail")
                severity = Severity.WARNING
            else:
                text += "; harmless while the GPU has free memory, a cause of out-of-memory errors once it does not"
                severity = Severity.INFO
            yield Finding(subject, text, severity)
