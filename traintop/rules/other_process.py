"""Another process holding GPU memory beside the attached job."""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.units import GiB, fmt_bytes


class OtherProcess(HostRule):
    id = "other_process"
    title = "Another process holds GPU memory"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 10.0
    now_s = None  # the process list now
    remedies = (
        "Check that it should be there (a stale notebook kernel, an old run, an evaluation job).",
        "Its memory is not available to the job: out-of-memory errors and smaller batches follow.",
        "It also shares the GPU's time: steps slow down while it computes.",
    )

    def evaluate(self, ctx: RuleContext):
        proc = ctx.process
        if proc is None or not proc.alive:
            return  # without an attached job there is no "other"
        ours = {m.pid for m in proc.members} | {proc.pid}
        for g in ctx.gpus():
            if not any(p.pid in ours for p in g.processes):
                continue  # a GPU the job does not use: another job's process there is no concern of its
            c = ctx.config
            others = [p for p in g.processes if p.pid not in ours
                      and ((p.used_bytes or 0) >= c.other_process_min_gib * GiB or (p.sm_util or 0) >= c.other_process_min_sm)]
            if others:
                listed = ", ".join(f"PID {p.pid} ({_what(p)})" for p in others[:4])
                yield Verdict(gpu_subject(g.index), f"GPU {g.index}: {listed} beside the job (PID {proc.pid})")


def _what(p) -> str:
    """Its memory and, where NVML gives it, its share of the GPU's time."""
    held = fmt_bytes(p.used_bytes) if p.used_bytes is not None else "memory unknown"
    return held if p.sm_util is None else f"{held}, busy {p.sm_util:.0f} % of the time"
