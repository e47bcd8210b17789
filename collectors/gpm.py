"""GPU Performance Monitoring (GPM) metrics of Hopper-class GPUs, through NVML.

GPM counts what the SMs actually did between two samples, so its figures are means over
the window, not the point sample that ``utilization.gpu`` is: SM activity, tensor-core
activity, DRAM bandwidth and PCIe traffic. ``nvidia-smi``'s "utilization" says only that
*some* kernel was running; a kernel on 3 SMs of 132 reads 100 %. GPM is how we tell.

One ``GpmReader`` per collector; ``poll()`` runs on the slow thread about once a second.
Devices without GPM (pre-Hopper, or bindings without the API) read ``None``.
"""

from __future__ import annotations

from typing import Any

# metric name -> NVML metric id (stable numbers from nvml.h; bindings may lack the names)
METRICS = {
    "sm_active": 2,       # NVML_GPM_METRIC_SM_UTIL: share of SMs busy, averaged over time
    "sm_occupancy": 3,    # NVML_GPM_METRIC_SM_OCCUPANCY: resident warps vs the maximum
    "tensor_active": 5,   # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "dram_active": 10,    # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bandwidth vs the maximum
    "pcie_tx": 20,        # NVML_GPM_METRIC_PCIE_TX_PER_SEC, MiB/s from the GPU
    "pcie_rx": 21,        # NVML_GPM_METRIC_PCIE_RX_PER_SEC, MiB/s to the GPU
}
_MIB = 1024.0 * 1024.0


class GpmReader:
    def __init__(self, nv, handles: list[Any]) -> None:
        self.nv = nv
        self.handles = handles
        self.supported = [self._supported(h) for h in handles]
        self._prev: list[Any] = [None] * len(handles)
        self._spare: list[Any] = [None] * len(handles)
        self.errors = 0

    @property
    def any(self) -> bool:
        return any(self.supported)

    def _supported(self, h) -> bool:
        nv = self.nv
        if not all(hasattr(nv, f) for f in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
                                            "nvmlGpmSampleGet", "nvmlGpmMetricsGet")):
            return False
        try:
            return bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception:  # NVMLError of any kind, or a binding that cannot call it
            return False

    def poll(self, i: int) -> dict[str, float | None] | None:
        """Metrics over the window since the previous poll of device ``i`` (None on the first)."""
        if not self.supported[i]:
            return None
        nv = self.nv
        try:
            if self._spare[i] is None:
                self._spare[i] = nv.nvmlGpmSampleAlloc()
            cur = nv.nvmlGpmSampleGet(self.handles[i], self._spare[i])
            prev = self._prev[i]
            self._prev[i], self._spare[i] = cur, prev
            if prev is None:
                return None
            return self._metrics(prev, cur)
        except nv.NVMLError:
            self.errors += 1
            self._prev[i] = None
            return None

    def _metrics(self, prev, cur) -> dict[str, float | None]:
        nv = self.nv
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        req.numMetrics = len(METRICS)
        req.sample1, req.sample2 = prev, cur
        for j, mid in enumerate(METRICS.values()):
            req.metrics[j].metricId = mid
        nv.nvmlGpmMetricsGet(req)
        out: dict[str, float | None] = {}
        for j, name in enumerate(METRICS):
            m = req.metrics[j]
            v = float(m.value) if m.nvmlReturn == 0 else None
            if v is not None and name.startswith("pcie"):
                v *= _MIB
            elif v is not None:
                v = min(max(v, 0.0), 100.0)
            out[name] = v
        return out

    def close(self) -> None:
        free = getattr(self.nv, "nvmlGpmSampleFree", None)
        if free is None:
            return
        for s in self._prev + self._spare:
            if s is not None:
                try:
                    free(s)
                except Exception:  # freeing at shutdown: nothing to report
                    pass
        self._prev = [None] * len(self.handles)
        self._spare = [None] * len(self.handles)
