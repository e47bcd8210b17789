"""Whose a GPU process is, in a few words: "PID 4242 alice · slurm 81234.0 · 20 GiB · busy 64 %".

Every name here (user, job, pod, run id) was written by someone else: each passes through
``one_line`` and reaches the screen as a Line run, never as markup.
"""

from __future__ import annotations

from traintop.samples import Owner
from traintop.text import one_line
from traintop.units import fmt_bytes
from traintop.reports.view import GpuProcView

NBSP = "\u00a0"
NOT_VISIBLE = "not visible from here"
SEP = " · "


def owner_parts(o: Owner) -> list[str]:
    """User, Slurm job, pod, torchrun run, container: those known, most telling first."""
    if not o.visible:
        return [NOT_VISIBLE]
    parts = [one_line(o.user, 32) if o.user else f"uid {o.uid}" if o.uid is not None else "user unknown"]
    if o.slurm_job:
        step = f".{one_line(o.slurm_step, 12)}" if o.slurm_step else ""
        parts.append(f"slurm {one_line(o.slurm_job, 24)}{step}")
    if o.pod:
        where = f"{one_line(o.namespace, 63)}/" if o.namespace else ""
        parts.append(f"pod {where}{one_line(o.pod, 63)}")
    elif o.pod_uid:
        parts.append(f"pod {one_line(o.pod_uid[:8], 8)}")
    if o.run_id:
        parts.append(f"torchrun {one_line(o.run_id, 40)}")
    if o.container:
        parts.append(f"{one_line(o.runtime or 'container', 12)} {one_line(o.container[:12], 12)}")
    return parts


def owner_text(o: Owner) -> str:
    return SEP.join(owner_parts(o))


def proc_text(p: GpuProcView, figures: bool = True, gpu: bool = False) -> str:
    """"PID 4242 alice · slurm 81234.0 · 20 GiB · busy 64 %" (``figures``: memory and share; ``gpu``: its GPU first)."""
    out = [f"GPU{NBSP}{p.gpu}"] if gpu else []
    who = owner_text(p.owner) if p.owner is not None else ""
    out.append(f"PID {p.pid} {who}".rstrip())
    if figures:
        if p.used_bytes is not None:
            out.append(fmt_bytes(p.used_bytes).replace(" ", NBSP))
        if p.sm_util is not None:
            out.append(f"busy{NBSP}{p.sm_util:.0f}{NBSP}%")
    return SEP.join(out)
