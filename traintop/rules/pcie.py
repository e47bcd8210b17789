"""Host-to-device bottleneck: copies to the GPU limit it while it waits.

Either the copies fill the PCIe link, or (far more common) they come from pageable host memory:
the CPU stages them through a pinned bounce buffer, a fraction of the link's speed, and the
copy blocks the stream. Measured on an H200 (Gen5 x16): 256 MiB pageable copies moved 7.8 GB/s
(12 % of the link) with utilization 18 %, SMs 1 % active and the main thread at 100 % of a core;
pinned 2 GiB copies moved 49 GB/s.
"""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.declaration import HostRule
from traintop.rules.engine import HOLDS, WEAK, Verdict, RuleContext, Severity
from traintop.samples import pcie_bandwidth
from traintop.units import fmt_bytes


class PcieBottleneck(HostRule):
    id = "pcie"
    title = "Host-to-device copies limit the GPU"
    severity = Severity.WARNING
    raise_after = 5.0  # the window already asks for a steady flow; and it must hold now
    now_s = 3.0  # a flow: a few seconds say whether it still runs
    clear_after = 20.0
    remedies = (
        "Pin host memory (DataLoader(pin_memory=True)) and copy with .to(device, non_blocking=True): "
        "pageable copies reach a fraction of the link's speed and block the stream.",
        "Send less: keep the data on the GPU when it fits (load it once), move decoding and augmentation to the GPU, send uint8 rather than float32, "
        "keep what does not change (embeddings, constants) on the GPU.",
        "Overlap the next batch's copy with this step's compute (prefetch on a side CUDA stream).",
        "If the link runs below its generation or width under load, reseat the card or check the slot/BIOS "
        "(nvidia-smi -q -d PCIE).",
    )

    GLOO_REMEDIES = (
        "Use the nccl backend for GPU tensors (dist.init_process_group(\"nccl\"), or "
        "\"cpu:gloo,cuda:nccl\" where CPU tensors need gloo): gloo copies each step's gradients to host "
        "memory and back; NCCL keeps them on the GPUs.",
        "Until then: fewer, larger all-reduces (DDP bucket_cap_mb) or gradient accumulation "
        "(no_sync()) send the same gradients less often.",
    )

    @classmethod
    def _over_gloo(cls, ctx: RuleContext, verdict: Verdict, gpu: int) -> Verdict:
        """The copies are the job's own gradients through gloo: said, with the advice that fits."""
        ranks = [r for _, r in ctx.feed(gpu).ranks if r.backend_name == "gloo" and (r.world_size or 0) > 1]
        if not ranks:
            return verdict
        who = ", ".join(r.label for r in ranks[:4])
        text = (verdict.evidence.split("; copies this slow come from")[0]
                + f"; the job's ranks on it ({who}) all-reduce over gloo, which moves every gradient GPU → host → GPU "
                  "in each step: these copies are its own")
        return Verdict(verdict.subject, text, verdict.severity, verdict.state,
                       cls.GLOO_REMEDIES + cls.remedies[1:2])

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.pcie_window_s
        for g in ctx.gpus():
            i, subject = g.index, gpu_subject(g.index)
            rx = ctx.gpu_pairs(i, "pcie_rx", w, min_n=3, min_span=0.4)
            u_mean = ctx.gpu_mean(i, "util", w)
            link = pcie_bandwidth(g.pcie_gen_max, g.pcie_width_max) or pcie_bandwidth(g.pcie_gen, g.pcie_width)
            if not rx or u_mean is None:
                continue
            if max(v for _, v in rx[-3:]) < c.pcie_pageable_min_gbs * 1e9 / 2:
                continue  # nothing crosses the link now, whatever the window still holds
            rx_mean = sum(v for _, v in rx) / len(rx)
            sm_mean = ctx.gpu_mean(i, "sm_active", w)
            pageable = self._pageable(ctx, g, rx, u_mean, sm_mean, link)
            if pageable is not None:
                yield self._over_gloo(ctx, pageable, i)
                continue
            if not link:
                continue
            threshold = c.pcie_min_link_frac * (0.85 if ctx.is_active(self.id, subject) else 1.0)
            # Copies count as "utilization" (on an H200, 2 GiB copies with a little compute read
            # 96 %); SM activity says whether the GPU computes while the link is full.
            waiting = u_mean < c.pcie_max_util or (sm_mean is not None and sm_mean < c.pcie_max_sm_active)
            if rx_mean < threshold * link or not waiting:
                continue
            text = (f"GPU {i} receives {fmt_bytes(rx_mean)}/s from the host, {rx_mean / link * 100:.0f} % of its "
                    f"PCIe link ({fmt_bytes(link)}/s), over the last {w:.0f} s")
            if sm_mean is not None:
                text += (f"; its SMs were active only {sm_mean:.0f} % of the time (utilization reads {u_mean:.0f} %: "
                         "copies count as busy)" if u_mean >= c.pcie_max_util else
                         f"; utilization {u_mean:.0f} %, SMs active {sm_mean:.0f} %")
            else:
                text += f"; utilization {u_mean:.0f} %"
            if g.pcie_gen and g.pcie_gen_max and g.pcie_width and g.pcie_width_max \
                    and (g.pcie_gen < g.pcie_gen_max or g.pcie_width < g.pcie_width_max):
                text += f"; the link runs at Gen{g.pcie_gen} x{g.pcie_width} of Gen{g.pcie_gen_max} x{g.pcie_width_max}"
            yield self._over_gloo(ctx, Verdict(subject, text), i)

    @staticmethod
    def _pageable(ctx: RuleContext, g, rx, u_mean, sm_mean, link) -> Verdict | None:
        """A steady stream to a waiting GPU, well below the link: staged (pageable) copies."""
        c, i = ctx.config, g.index
        values = sorted(v for _, v in rx)
        low = values[len(values) // 4]  # sustained: the lower quartile, not a burst
        rx_mean = sum(values) / len(values)
        relax = 0.8 if ctx.is_active("pcie", gpu_subject(i)) else 1.0
        if low < c.pcie_pageable_min_gbs * 1e9 * relax:
            return None
        if link and rx_mean >= c.pcie_min_link_frac * link:
            return None  # the link itself is full: the other branch
        waiting = u_mean < c.pcie_pageable_max_util and (sm_mean is None or sm_mean < c.pcie_max_sm_active / 2)
        if not waiting:
            return None
        text = f"GPU {i} receives a steady {fmt_bytes(rx_mean)}/s from the host over the last {c.pcie_window_s:.0f} s"
        text += (f", only {rx_mean / link * 100:.0f} % of its PCIe link ({fmt_bytes(link)}/s)" if link else
                 " (far below what a PCIe Gen4/Gen5 x16 link carries)")
        text += f", while it waits: utilization {u_mean:.0f} %"
        if sm_mean is not None:
            text += f", SMs active {sm_mean:.0f} %"
        proc = ctx.process
        main = proc.members[0].cpu_percent if proc is not None and proc.alive and proc.members else None
        busy = main is not None and main >= 85
        if busy:
            text += f"; the job's main process is busy on the CPU ({main:.0f} % of a core) staging the copies"
        text += ("; copies this slow come from pageable (not pinned) host memory: the CPU stages them through a "
                 "bounce buffer and each one blocks the stream")
        # an attached job's busy CPU is part of the evidence: a sample without it (the job ending) does not
        # replace one with it
        strong = busy or proc is None or not ctx.is_active("pcie", gpu_subject(i))
        return Verdict(gpu_subject(i), text, state=HOLDS if strong else WEAK)
