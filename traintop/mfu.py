"""Model FLOPs utilization: the FLOPs one optimizer step does, over what the GPU could do in that time.

The peaks are NVIDIA's datasheet figures for dense math (no 2:4 sparsity), in TFLOP/s, by the
precision the job's matmuls run in (the probe reads it on the training thread). A GPU not in the
table has no MFU (never a guess); docs/GOODPUT.md lists the table.
"""

from __future__ import annotations

MFU_SPAN_S = 30.0  # the live MFU is that of the steps over their last this much (view, agent)

# (name fragment as NVML reports it, {matmul precision: dense TFLOP/s}); the first match wins,
# so the more specific names come first.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200 NVL", {"fp32": 60.0, "tf32": 418.0, "bf16": 835.0, "fp16": 835.0}),
    ("H200", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 418.0, "bf16": 835.0, "fp16": 835.0}),
    ("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    ("H100", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),  # SXM5 (HBM3)
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0}),
)


def peak_flops(gpu_name: str | None, matmul: str | None) -> float | None:
    """FLOP/s the GPU peaks at for that precision (None: GPU or precision not known)."""
    if not gpu_name or not matmul:
        return None
    for fragment, peaks in PEAK_TFLOPS:
        if fragment in gpu_name:
            tflops = peaks.get(matmul)
            return tflops * 1e12 if tflops else None
    return None


def mfu(step_flops: float | None, step_time: float | None, gpu_name: str | None, matmul: str | None) -> float | None:
    """Share (0..1) of the GPU's peak that one step's FLOPs over its measured time make (None: unknown)."""
    peak = peak_flops(gpu_name, matmul)
    if peak is None or not step_flops or not step_time or step_time <= 0:
        return None
    return min(1.0, step_flops / step_time / peak)
