"""Fragmentation: much of the caching allocator's memory sits in split blocks.

Split blocks (``inactive_split_bytes``) are the free pieces of segments partly in use: a larger
request cannot take them, so the cache grows or the allocation fails. They count while live tensors sit among
them; a cache far above what is allocated is not by itself fragmentation: the probe often reads
allocated between steps, when the activations are freed (a healthy conv job reads 70 MiB
allocated of 20 GiB reserved there, 8 GiB of it in split blocks, and 19 GiB inside a step).
Allocations that fail or retry are the out-of-memory finding (traintop.rules.oom)."""

from __future__ import annotations

from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.units import GiB, fmt_bytes


WINDOW_S = 60.0
LIVE_MIN_FRAC = 0.25  # split blocks count while live tensors hold at least this share of the cache


class Fragmentation(HostRule):
    id = "fragmentation"
    title = "Allocator fragmentation"
    severity = Severity.WARNING
    defers_to = ("oom",)  # allocations fail or retry: that finding says so, with the split blocks
    raise_after = 10.0
    clear_after = 60.0
    now_s = None  # the allocator's state now
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
            if any(ctx.is_holding(r, subject) for r in self.defers_to):
                continue  # allocations fail or retry: that finding says so, with the split blocks
            # Split blocks are the free pieces of segments partly in use: a larger request cannot take
            # them. They count while live tensors sit among them: between the steps of a healthy job
            # little is allocated (a conv job: 70 MiB of 20 GiB), its split blocks are reused by the
            # next step, and its forward and backward passes reach the allocator's peak.
            split = r.inactive_split or 0
            split_frac = split / r.reserved
            live = max(ctx.rank_window(subject, "allocated", WINDOW_S) + [r.allocated])
            unused = max(0, r.reserved - live)
            if (split < c.frag_min_unused_gib * GiB or split_frac < c.frag_min_unused_frac
                    or unused < c.frag_min_unused_gib * GiB or r.allocated < LIVE_MIN_FRAC * r.reserved):
                continue
            text = (f"{r.label} reserves {fmt_bytes(r.reserved)}; {fmt_bytes(split)} of it ({split_frac * 100:.0f} %) "
                    f"in split blocks between {fmt_bytes(r.allocated)} of live tensors, which larger allocations "
                    f"cannot use (at most {fmt_bytes(live)} allocated over the last {WINDOW_S:.0f} s")
            text += f", peak {fmt_bytes(r.peak)} since it started)" if r.peak else ")"
            g = gpus.get(r.device) if r.device is not None else (next(iter(gpus.values())) if len(gpus) == 1 else None)
            tight = bool(g and g.mem_used is not None and g.mem_total and g.mem_used >= 0.9 * g.mem_total)
            if tight:
                text += "; the GPU's memory is nearly full, so the next large allocation may fail"
                severity = Severity.WARNING
            else:
                text += "; harmless while the GPU has free memory, a cause of out-of-memory errors once it does not"
                severity = Severity.INFO
            yield Verdict(subject, text, severity)
