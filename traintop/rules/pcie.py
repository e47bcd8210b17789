"""Host-to-device bottleneck: copies to the GPU fill the PCIe link while the GPU waits."""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.engine import Finding, RuleContext, Severity
from traintop.samples import pcie_bandwidth
from traintop.units import fmt_bytes


class PcieBottleneck:
    id = "pcie"
    title = "Host-to-device copies limit the GPU"
    severity = Severity.WARNING
    raise_after = 10.0
    clear_after = 20.0
    remedies = (
        "Pin host memory (DataLoader(pin_memory=True)) and copy with .to(device, non_blocking=True): "
        "pageable copies reach a fraction of the link's speed and block the stream.",
        "Send less: move decoding and augmentation to the GPU, send uint8 rather than float32, "
        "keep what does not change (embeddings, constants) on the GPU.",
        "Overlap the next batch's copy with this step's compute (prefetch on a side CUDA stream).",
        "If the link runs below its generation or width under load, reseat the card or check the slot/BIOS "
        "(nvidia-smi -q -d PCIE).",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.pcie_window_s
        for g in ctx.gpus():
            i, subject = g.index, gpu_subject(g.index)
            rx = ctx.gpu_pairs(i, "pcie_rx", w, min_n=3, min_span=0.4)
            u_mean = ctx.gpu_mean(i, "util", w)
            link = pcie_bandwidth(g.pcie_gen_max, g.pcie_width_max) or pcie_bandwidth(g.pcie_gen, g.pcie_width)
            if not rx or u_mean is None or not link:
                continue
            rx_mean = sum(v for _, v in rx) / len(rx)
            sm_mean = ctx.gpu_mean(i, "sm_active", w)
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
            yield Finding(subject, text)
