"""XID and ECC errors: the driver reporting a fault, or memory errors accumulating."""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity

# The XIDs people meet most; the full list is NVIDIA's "XID Errors" document.
XID_MEANING = {
    13: "graphics engine exception (often an out-of-range access in a kernel)",
    31: "GPU memory page fault (an illegal address in a kernel; usually the application)",
    43: "GPU stopped processing (the application hit a fault and was reset)",
    45: "preemptive cleanup after a fault (the process was killed or crashed)",
    48: "double-bit (uncorrectable) ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the affected application was stopped)",
    95: "uncontained ECC error (all applications on the GPU are affected)",
    109: "context switch timeout",
    119: "GSP firmware timeout",
    120: "GSP firmware error",
}
_APPLICATION_XIDS = {13, 31, 43, 45}  # faults in one application's work, not the hardware


def xid_text(code: int) -> str:
    return f"XID {code}: {XID_MEANING.get(code, 'see NVIDIA XID Errors documentation')}"


class GpuErrors(HostRule):
    id = "gpu_errors"
    title = "GPU errors (XID / ECC)"
    severity = Severity.CRITICAL
    raise_after = 0.0
    clear_after = 300.0  # an error stays on screen for five minutes after the last one
    now_s = None  # an event: it happened
    remedies = (
        "Read the driver's log for the XID (dmesg | grep -i xid) and look the code up in NVIDIA's XID document.",
        "XID 13/31/43/45 are usually the application (an illegal memory access): rerun with "
        "CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer to find the kernel.",
        "Uncorrectable ECC errors, row-remap failures, XID 48/79/94/95: drain the node and tell the operator; "
        "a pending row remap needs a GPU reset.",
        "Checkpoint now: a GPU reporting hardware errors can take the job down.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        for g in ctx.gpus():
            i = g.index
            xids = [int(x) for x in ctx.gpu_window(i, "xid", 300.0)]
            unc = ctx.gpu_window(i, "ecc_uncorrected", 300.0)
            corr = ctx.gpu_pairs(i, "ecc_corrected", 60.0)
            parts, sev = [], Severity.WARNING
            if xids:
                last = xids[-1]
                parts.append(f"GPU {i} reported {len(xids)} XID event(s) in the last 5 min; last {xid_text(last)}")
                if any(x not in _APPLICATION_XIDS for x in xids):
                    sev = Severity.CRITICAL
            if len(unc) >= 2 and unc[-1] > unc[0]:
                parts.append(f"{unc[-1] - unc[0]:.0f} new uncorrectable ECC error(s)")
                sev = Severity.CRITICAL
            if len(corr) >= 2 and corr[-1][0] > corr[0][0]:
                per_min = (corr[-1][1] - corr[0][1]) * 60.0 / max(corr[-1][0] - corr[0][0], 1.0)
                if per_min >= c.ecc_corrected_per_min:
                    parts.append(f"corrected ECC errors rising at {per_min:.0f} a minute")
            if g.remap_pending:
                parts.append("a memory row remap is pending (needs a GPU reset)")
            if parts:
                text = "; ".join(parts) if xids else f"GPU {i}: " + "; ".join(parts)
                yield Verdict(gpu_subject(i), text, sev)
