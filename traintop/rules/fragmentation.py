"""Fragmentation: the caching allocator holds far more than is allocated and still retries."""

from __future__ import annotations

from traintop.rules.engine import Finding, RuleContext, Severity
from traintop.units import GiB, fmt_bytes


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
        frame = ctx.store.latest
        for k, r in enumerate(frame.ranks if frame else ()):
            if not r.cuda or not r.reserved or r.allocated is None:
                continue
            key = f"rank{r.rank if r.rank is not None else k}.alloc_retries"
            retries = [v for v in ctx.store.window(key, 60.0) if v is not None]
            rising = len(retries) >= 2 and retries[-1] > retries[0]
            unused = r.reserved - r.allocated
            frac = unused / r.reserved
            if frac < c.frag_min_unused_frac or unused < c.frag_min_unused_gib * GiB or not (rising or r.ooms):
                continue
            text = (f"{r.label} reserves {fmt_bytes(r.reserved)} but has {fmt_bytes(r.allocated)} allocated "
                    f"({frac * 100:.0f} % held unused) and retried {r.alloc_retries} allocation(s)")
            if r.ooms:
                text += f"; {r.ooms} out-of-memory error(s)"
            yield Finding(f"rank{r.rank if r.rank is not None else k}", text,
                          Severity.CRITICAL if r.ooms else None)
